//! Who holds each block of a managed allocation: the device, or the host with a clean or a
//! dirty copy. Pure bookkeeping: [`super`] turns its answers into fetches, write-backs and
//! page protections.

/// The state of one block.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Block {
    /// Never handed to the device: the host view is writable like ordinary memory (system
    /// calls may fill it too); the device copy holds what a new allocation holds, so at the
    /// first hand-over only the pages the host touched need to go.
    Fresh,
    /// The device's copy is the current one; the host view is inaccessible.
    Device,
    /// The host view is readable and equal to the device's copy.
    HostClean,
    /// The host view is writable and newer than the device's copy.
    HostDirty,
}

/// What the faulting access was, where the processor tells (x86-64 does).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Touch {
    Read,
    Write,
    Unknown,
}

/// What a fault on a block asks for.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum FaultAction {
    /// Fetch the block from the device first, then map it.
    Fetch(Mapped),
    /// Map it (the host copy is current).
    Map(Mapped),
    /// Nothing: the block was mapped for this access while the fault waited its turn (two
    /// threads touched it at once); the access is tried again.
    Retry,
}

/// How a block is mapped for the host.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Mapped {
    Readable,
    Writable,
}

/// Consecutive blocks `first..first + count`.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Run {
    pub first: usize,
    pub count: usize,
}

/// What handing an allocation to the device takes.
#[derive(Default, PartialEq, Eq, Debug)]
pub struct HandOver {
    /// Dirty blocks, to be written to the device first.
    pub write_back: Vec<Run>,
    /// Fresh blocks: the pages of them the host touched are written to the device first.
    pub fresh: Vec<Run>,
    /// Blocks the host could touch, to be made inaccessible.
    pub protect: Vec<Run>,
}

pub struct Blocks {
    states: Vec<Block>,
}

impl Blocks {
    pub fn new(count: usize) -> Blocks {
        Blocks {
            states: vec![Block::Fresh; count],
        }
    }

    #[cfg(test)]
    pub fn state(&self, index: usize) -> Block {
        self.states[index]
    }

    /// The host touched block `index` in a way its protection refused (or did, before
    /// another thread's fault changed it).
    pub fn fault(&mut self, index: usize, touch: Touch) -> FaultAction {
        use FaultAction::{Fetch, Map, Retry};
        use Mapped::{Readable, Writable};
        let write = touch == Touch::Write;
        let (next, action) = match (self.states[index], touch) {
            // Writable already: another thread's access.
            (Block::Fresh, _) => (Block::Fresh, Retry),
            (Block::Device, _) if write => (Block::HostDirty, Fetch(Writable)),
            (Block::Device, _) => (Block::HostClean, Fetch(Readable)),
            // A read fault on a readable block: it was mapped while this fault waited.
            (Block::HostClean, Touch::Read) => (Block::HostClean, Retry),
            // Otherwise a write (or, where the processor does not tell, taken as one).
            (Block::HostClean, _) => (Block::HostDirty, Map(Writable)),
            (Block::HostDirty, _) => (Block::HostDirty, Retry),
        };
        self.states[index] = next;
        action
    }

    /// The device may now change every block: dirty ones go back first, and the host loses
    /// its view of all of them.
    pub fn hand_over(&mut self) -> HandOver {
        let hand_over = HandOver {
            write_back: self.runs(|b| b == Block::HostDirty),
            fresh: self.runs(|b| b == Block::Fresh),
            protect: self.runs(|b| b != Block::Device),
        };
        self.states.fill(Block::Device);
        hand_over
    }

    fn runs(&self, wanted: impl Fn(Block) -> bool) -> Vec<Run> {
        let mut runs: Vec<Run> = Vec::new();
        for (index, &state) in self.states.iter().enumerate() {
            if !wanted(state) {
                continue;
            }
            match runs.last_mut() {
                Some(run) if run.first + run.count == index => run.count += 1,
                _ => runs.push(Run {
                    first: index,
                    count: 1,
                }),
            }
        }
        runs
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(first: usize, count: usize) -> Run {
        Run { first, count }
    }

    use FaultAction::{Fetch, Map, Retry};
    use Mapped::{Readable, Writable};

    #[test]
    fn fresh_blocks_are_the_hosts_until_the_first_hand_over() {
        let mut blocks = Blocks::new(3);
        assert_eq!(blocks.fault(0, Touch::Write), Retry);
        assert_eq!(blocks.state(0), Block::Fresh);
        assert_eq!(
            blocks.hand_over(),
            HandOver {
                write_back: vec![],
                fresh: vec![run(0, 3)],
                protect: vec![run(0, 3)],
            }
        );
        assert_eq!(blocks.fault(1, Touch::Unknown), Fetch(Readable));
        assert_eq!(blocks.fault(1, Touch::Unknown), Map(Writable));
        assert_eq!(blocks.state(1), Block::HostDirty);
        assert_eq!(blocks.fault(1, Touch::Unknown), Retry);
    }

    #[test]
    fn after_a_hand_over_every_block_is_fetched_again() {
        let mut blocks = Blocks::new(3);
        blocks.hand_over();
        assert_eq!(blocks.fault(0, Touch::Read), Fetch(Readable));
        assert_eq!(blocks.fault(1, Touch::Unknown), Fetch(Readable));
        assert_eq!(blocks.fault(2, Touch::Write), Fetch(Writable));
        assert_eq!(blocks.state(2), Block::HostDirty);
    }

    #[test]
    fn faults_that_waited_while_another_mapped_the_block_retry() {
        let mut blocks = Blocks::new(1);
        blocks.hand_over();
        assert_eq!(blocks.fault(0, Touch::Read), Fetch(Readable));
        assert_eq!(blocks.fault(0, Touch::Read), Retry, "no second fetch");
        assert_eq!(
            blocks.state(0),
            Block::HostClean,
            "a read does not dirty it"
        );
        assert_eq!(blocks.fault(0, Touch::Write), Map(Writable));
        assert_eq!(blocks.fault(0, Touch::Read), Retry);
        assert_eq!(blocks.fault(0, Touch::Write), Retry);
    }

    #[test]
    fn a_hand_over_writes_back_dirty_runs_and_protects_every_host_run() {
        let mut blocks = Blocks::new(8);
        blocks.hand_over();
        // 0,1 dirty; 2 clean; 4 dirty; 6 clean; 3, 5, 7 untouched.
        for index in [0, 1, 2, 4, 6] {
            blocks.fault(index, Touch::Read);
        }
        for index in [0, 1, 4] {
            blocks.fault(index, Touch::Write);
        }
        assert_eq!(
            blocks.hand_over(),
            HandOver {
                write_back: vec![run(0, 2), run(4, 1)],
                fresh: vec![],
                protect: vec![run(0, 3), run(4, 1), run(6, 1)],
            }
        );
        assert!((0..8).all(|i| blocks.state(i) == Block::Device));
        assert_eq!(
            blocks.hand_over(),
            HandOver::default(),
            "nothing left to do"
        );
    }
}
