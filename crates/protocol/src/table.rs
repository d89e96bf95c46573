//! `wire_api!`: a wire API declared once, as a table of its messages.
//!
//! Each line of a table is one message: how it is answered (its mode), whether its request
//! carries bulk data, its name (the enum variant, then the method), its fields and, for a call,
//! its reply type:
//!
//! ```text
//! /// Docs, shared by everything made from the line.
//! call MemAlloc mem_alloc(ctx: Id, size: u64) -> Result<DevicePtr, Status>;
//! post [bulk] MemcpyHtoD memcpy_htod(ctx: Id, stream: Id, dst: DevicePtr, ...);
//! read MemcpyDtoH memcpy_dtoh(ctx: Id, stream: Id, src: DevicePtr, ...);
//! ```
//!
//! Modes:
//! - `call`: the server answers with the reply type, which the server method returns.
//! - `wait`: a call whose server method sends the reply itself, possibly later (when the work
//!   it waits for is done); it gets the request's `seq` for that.
//! - `post`: no reply; a failure the server method returns is kept for the next synchronizing
//!   call (the server trait's `defer`).
//! - `read`: the reply is the data, in `ServerMsg::Data` frames, then `ServerMsg::ReadDone`
//!   with the status; the server method sends them itself and gets the `seq`.
//!
//! `[bulk]`: the request carries bulk data (the server method gets its length and reads it).
//!
//! From a table come: the request enum, the reply enum (one variant per message, at the same
//! index as its request, so that an answer names what it answers; messages without a reply
//! hold [`Never`]), the mode and bulk predicates, a client trait with a typed method per message
//! (its transport is three required methods), in a module `serve` a server trait per group of
//! messages (`group Memory { ... }` in the table: the server implements each group in its own
//! file) with one method per message, and `dispatch`, which checks the bulk, calls the method
//! and sends the reply or defers the status; and samples of every message for the golden-byte
//! tests. Adding a message is its table line, its server method and its callers; the compiler
//! finds a forgotten one.
//!
//! Why `macro_rules!` (like ZLUDA's `for_each_*` lists) and not a proc-macro or `build.rs`:
//! the table stays ordinary Rust that rust-analyzer and rustdoc read, no extra crate or build
//! step, and the expansion is plain enough to read with `cargo expand`.

use serde::{Deserialize, Serialize};

/// The reply of a message that has none: no value of it exists.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Never {}

/// A reply that says only that its request failed with `status` (a server without the API
/// refuses every request with one).
pub trait FromStatus<S> {
    fn from_status(status: S) -> Self;

    /// The error code this reply reports, if it reports a failure (for the server's metrics).
    fn failure(&self) -> Option<i64> {
        None
    }
}

/// A status type: its value as a number (0 is success in every API of the tables).
pub trait ErrorCode: Copy {
    fn code(self) -> i64;
}

impl ErrorCode for i32 {
    fn code(self) -> i64 {
        self.into()
    }
}

impl ErrorCode for u32 {
    fn code(self) -> i64 {
        self.into()
    }
}

/// A non-zero status, as a failure's code.
pub fn failure_of(status: impl ErrorCode) -> Option<i64> {
    Some(status.code()).filter(|&code| code != 0)
}

impl<T, S: ErrorCode> FromStatus<S> for Result<T, S> {
    fn from_status(status: S) -> Self {
        Err(status)
    }

    fn failure(&self) -> Option<i64> {
        self.as_ref().err().and_then(|&s| failure_of(s))
    }
}

impl FromStatus<u32> for u32 {
    fn from_status(status: u32) -> Self {
        status
    }

    fn failure(&self) -> Option<i64> {
        failure_of(*self)
    }
}

/// A reply that carries nothing (a status-less message is never refused with a status).
impl<S> FromStatus<S> for () {
    fn from_status(_: S) -> Self {}
}

impl FromStatus<i32> for i32 {
    fn from_status(status: i32) -> Self {
        status
    }

    fn failure(&self) -> Option<i64> {
        failure_of(*self)
    }
}

/// What the client of a table got when the server's answer was for another message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnexpectedReply {
    pub request: &'static str,
    pub reply: &'static str,
}

impl std::fmt::Display for UnexpectedReply {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the reply to {} was one to {}", self.request, self.reply)
    }
}

impl std::error::Error for UnexpectedReply {}

/// Declares a wire API from its table; see the module docs.
macro_rules! wire_api {
    (
        request: $Request:ident,
        reply: $Reply:ident,
        status: $Status:ty,
        client: $Client:ident;
        $(
            $(#[$group_doc:meta])*
            group $Group:ident {
                $(
                    $(#[$doc:meta])*
                    $mode:ident $([$bulk:ident])? $Variant:ident $method:ident
                        ( $($field:ident : $fty:ty),* $(,)? ) $(-> $reply:ty)? ;
                )*
            }
        )*
    ) => {
        /// Requests, one variant per message of the table.
        #[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
        pub enum $Request {
            $($( $(#[$doc])* $Variant { $($field: $fty),* }, )*)*
        }

        /// Replies, one variant per message of the table, at its request's index.
        #[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
        pub enum $Reply {
            $($( $Variant(wire_api!(@reply_type $mode $(-> $reply)?)), )*)*
        }

        impl $Request {
            /// Every message's name, in table order.
            pub const NAMES: &'static [&'static str] = &[$($(stringify!($Variant)),*),*];

            /// The message's name (its variant).
            pub fn name(&self) -> &'static str {
                match self {
                    $($( Self::$Variant { .. } => stringify!($Variant), )*)*
                }
            }

            /// Whether the server answers it (a reply, or a read's data and end).
            pub fn expects_reply(&self) -> bool {
                match self {
                    $($( Self::$Variant { .. } => wire_api!(@answered $mode), )*)*
                }
            }

            /// Whether bulk data follows it.
            pub fn takes_bulk(&self) -> bool {
                match self {
                    $($( Self::$Variant { .. } => wire_api!(@bulk $($bulk)?), )*)*
                }
            }

            /// Whether its answer is a read's data and end.
            pub fn reads(&self) -> bool {
                match self {
                    $($( Self::$Variant { .. } => wire_api!(@reads $mode), )*)*
                }
            }

            /// The reply refusing this request with `status`; `None` for a post, which has no
            /// reply, and for a read, which ends with `ServerMsg::ReadDone` instead.
            pub fn refusal(&self, status: $Status) -> Option<$Reply> {
                match self {
                    $($( Self::$Variant { .. } => {
                        wire_api!(@refusal $mode $Reply $Variant status $(-> $reply)?)
                    } )*)*
                }
            }

            /// One request of every message, each field its [`Sample`](crate::sample::Sample),
            /// for the golden-byte tests.
            pub fn samples() -> Vec<$Request> {
                vec![$($(
                    Self::$Variant { $($field: <$fty as $crate::sample::Sample>::sample()),* },
                )*)*]
            }

            /// Each message again with one field at each further value of its type's
            /// [`variants`](crate::sample::Sample::variants), named `Message.field[k]`: with
            /// `samples`, every variant of every type a request carries, for the golden-byte
            /// tests.
            pub fn field_variants() -> Vec<(String, $Request)> {
                let mut all = Vec::new();
                $($(
                    let of_message = || {
                        Self::samples()
                            .into_iter()
                            .find(|m| matches!(m, Self::$Variant { .. }))
                            .expect("every message has a sample")
                    };
                    let _ = &of_message;
                    $(
                        let varied = $crate::sample::with_each_further(
                            of_message,
                            |one: &mut Self| match one {
                                Self::$Variant { $field, .. } => Some($field),
                                #[allow(unreachable_patterns)]
                                _ => None,
                            },
                        );
                        for (k, one) in varied.into_iter().enumerate() {
                            let (message, field) = (stringify!($Variant), stringify!($field));
                            all.push((format!("{message}.{field}[{}]", k + 1), one));
                        }
                    )*
                )*)*
                all
            }
        }

        impl $Reply {
            /// The name of the message it answers.
            pub fn name(&self) -> &'static str {
                match self {
                    $($( Self::$Variant(_) => stringify!($Variant), )*)*
                }
            }

            /// The error code it reports, if it reports a failure.
            pub fn failure(&self) -> Option<i64> {
                match self {
                    $($( Self::$Variant(reply) => wire_api!(@failure $mode reply, $Status), )*)*
                }
            }

            /// A reply of every message that has one, for the golden-byte tests.
            pub fn samples() -> Vec<$Reply> {
                let mut all = Vec::new();
                $($( wire_api!(@reply_sample all $mode $Variant $(-> $reply)?); )*)*
                all
            }

            /// Each reply again at each further value of its type's
            /// [`variants`](crate::sample::Sample::variants), named `Message[k]`.
            pub fn further_variants() -> Vec<(String, $Reply)> {
                let mut all = Vec::new();
                $($( wire_api!(@reply_variants all $mode $Variant $(-> $reply)?); )*)*
                all
            }
        }

        impl $crate::sample::Sample for $Request {
            fn sample() -> Self {
                Self::samples().remove(0)
            }

            fn variants() -> Vec<Self> {
                Self::samples()
            }
        }

        impl $crate::sample::Sample for $Reply {
            fn sample() -> Self {
                Self::samples().remove(0)
            }

            fn variants() -> Vec<Self> {
                Self::samples()
            }
        }

        /// The client side of the table: a typed method per message over three transport
        /// methods (implemented by the client library's connection).
        pub trait $Client {
            type Error: From<$crate::table::UnexpectedReply>;
            /// Where a read's data goes.
            type Sink;
            /// Sends a request that is answered and waits for the answer.
            fn send_call(&self, request: $Request, bulk: &[u8]) -> Result<$Reply, Self::Error>;
            /// Queues a request without a reply.
            fn send_post(&self, request: $Request, bulk: &[u8]) -> Result<(), Self::Error>;
            /// Sends a read; its data and end go to `sink`.
            fn send_read(&self, request: $Request, sink: Self::Sink) -> Result<(), Self::Error>;

            $($(
                wire_api!(@client_method $mode [$($bulk)?] $(#[$doc])*
                    $Request $Reply $Variant $method ($($field: $fty),*) $(-> $reply)?);
            )*)*
        }

        /// The server side of the table: a trait per group of messages, with a method per
        /// message, and `dispatch`, which calls them.
        pub mod serve {
            #[allow(unused_imports)]
            use super::*;

            /// What every group's methods share: the session's replies, its deferred failures.
            pub trait Server {
                /// Why the session ends (the connection failed, the client broke the protocol).
                type End;
                /// Sends the reply to the request `seq`.
                fn reply(&mut self, seq: u64, reply: $Reply) -> Result<(), Self::End>;
                /// Keeps a posted message's failure for the next synchronizing call.
                fn defer(&mut self, message: &'static str, status: $Status);
                /// Bulk data came with a message that takes none.
                fn unexpected_bulk(&mut self, message: &'static str, bulk_len: u64) -> Self::End;
            }

            $(
                $(#[$group_doc])*
                pub trait $Group: Server {
                    $(
                        wire_api!(@server_method $mode [$($bulk)?] $(#[$doc])*
                            $Status, $method ($($field: $fty),*) $(-> $reply)?);
                    )*
                }
            )*

            /// Carries out one request on `server`: checks that bulk data comes only with a
            /// message that takes it, calls the message's method and sends its reply (calls)
            /// or defers its failure (posts). `Err` ends the session.
            pub fn dispatch<S: Server $(+ $Group)* + ?Sized>(
                server: &mut S,
                seq: u64,
                bulk_len: u64,
                request: $Request,
            ) -> Result<(), S::End> {
                if bulk_len > 0 && !request.takes_bulk() {
                    return Err(server.unexpected_bulk(request.name(), bulk_len));
                }
                match request {
                    $($(
                        $Request::$Variant { $($field),* } => wire_api!(@dispatch $mode
                            [$($bulk)?] server seq bulk_len $Reply $Variant $method
                            ($($field),*)),
                    )*)*
                }
            }
        }
    };

    (@failure post $reply:ident, $Status:ty) => { match *$reply {} };
    (@failure read $reply:ident, $Status:ty) => { match *$reply {} };
    (@failure $mode:ident $reply:ident, $Status:ty) => {
        $crate::table::FromStatus::<$Status>::failure($reply)
    };

    (@reply_type call -> $reply:ty) => { $reply };
    (@reply_type wait -> $reply:ty) => { $reply };
    (@reply_type post) => { $crate::table::Never };
    (@reply_type read) => { $crate::table::Never };

    (@refusal call $Reply:ident $Variant:ident $status:ident -> $reply:ty) => {
        Some($Reply::$Variant($crate::table::FromStatus::from_status($status)))
    };
    (@refusal wait $Reply:ident $Variant:ident $status:ident -> $reply:ty) => {
        Some($Reply::$Variant($crate::table::FromStatus::from_status($status)))
    };
    (@refusal $mode:ident $Reply:ident $Variant:ident $status:ident) => { None };

    (@answered post) => { false };
    (@answered $mode:ident) => { true };
    (@reads read) => { true };
    (@reads $mode:ident) => { false };
    (@bulk bulk) => { true };
    (@bulk) => { false };

    (@reply_sample $all:ident call $Variant:ident -> $reply:ty) => {
        $all.push(Self::$Variant(<$reply as $crate::sample::Sample>::sample()))
    };
    (@reply_sample $all:ident wait $Variant:ident -> $reply:ty) => {
        $all.push(Self::$Variant(<$reply as $crate::sample::Sample>::sample()))
    };
    (@reply_sample $all:ident $mode:ident $Variant:ident) => {};
    (@reply_variants $all:ident call $Variant:ident -> $reply:ty) => {
        wire_api!(@reply_variants $all wait $Variant -> $reply)
    };
    (@reply_variants $all:ident wait $Variant:ident -> $reply:ty) => {
        let values = <$reply as $crate::sample::Sample>::variants();
        for (k, value) in values.into_iter().enumerate().skip(1) {
            $all.push((format!("{}[{k}]", stringify!($Variant)), Self::$Variant(value)));
        }
    };
    (@reply_variants $all:ident $mode:ident $Variant:ident) => {};

    // Client methods.
    (@client_method call [] $(#[$doc:meta])* $Request:ident $Reply:ident $Variant:ident
        $method:ident ($($field:ident : $fty:ty),*) -> $reply:ty) => {
        $(#[$doc])*
        #[allow(clippy::too_many_arguments)]
        fn $method(&self, $($field: $fty),*) -> Result<$reply, Self::Error> {
            let reply = self.send_call($Request::$Variant { $($field),* }, &[])?;
            wire_api!(@expect $Reply $Variant reply)
        }
    };
    (@client_method call [bulk] $(#[$doc:meta])* $Request:ident $Reply:ident $Variant:ident
        $method:ident ($($field:ident : $fty:ty),*) -> $reply:ty) => {
        $(#[$doc])*
        #[allow(clippy::too_many_arguments)]
        fn $method(&self, $($field: $fty,)* bulk: &[u8]) -> Result<$reply, Self::Error> {
            let reply = self.send_call($Request::$Variant { $($field),* }, bulk)?;
            wire_api!(@expect $Reply $Variant reply)
        }
    };
    (@client_method wait [] $($rest:tt)*) => { wire_api!(@client_method call [] $($rest)*); };
    (@client_method post [] $(#[$doc:meta])* $Request:ident $Reply:ident $Variant:ident
        $method:ident ($($field:ident : $fty:ty),*)) => {
        $(#[$doc])*
        #[allow(clippy::too_many_arguments)]
        fn $method(&self, $($field: $fty),*) -> Result<(), Self::Error> {
            self.send_post($Request::$Variant { $($field),* }, &[])
        }
    };
    (@client_method post [bulk] $(#[$doc:meta])* $Request:ident $Reply:ident $Variant:ident
        $method:ident ($($field:ident : $fty:ty),*)) => {
        $(#[$doc])*
        #[allow(clippy::too_many_arguments)]
        fn $method(&self, $($field: $fty,)* bulk: &[u8]) -> Result<(), Self::Error> {
            self.send_post($Request::$Variant { $($field),* }, bulk)
        }
    };
    (@client_method read [] $(#[$doc:meta])* $Request:ident $Reply:ident $Variant:ident
        $method:ident ($($field:ident : $fty:ty),*)) => {
        $(#[$doc])*
        #[allow(clippy::too_many_arguments)]
        fn $method(&self, $($field: $fty,)* sink: Self::Sink) -> Result<(), Self::Error> {
            self.send_read($Request::$Variant { $($field),* }, sink)
        }
    };
    (@expect $Reply:ident $Variant:ident $reply:ident) => {
        // A table of one message has no other reply.
        #[allow(unreachable_patterns)]
        match $reply {
            $Reply::$Variant(value) => Ok(value),
            other => Err($crate::table::UnexpectedReply {
                request: stringify!($Variant),
                reply: other.name(),
            }
            .into()),
        }
    };

    // Server methods. Only those that read bulk data or send can end the session (`End`).
    (@server_method call [] $(#[$doc:meta])* $Status:ty, $method:ident
        ($($field:ident : $fty:ty),*) -> $reply:ty) => {
        $(#[$doc])*
        #[allow(clippy::too_many_arguments)]
        fn $method(&mut self, $($field: $fty),*) -> $reply;
    };
    (@server_method call [bulk] $(#[$doc:meta])* $Status:ty, $method:ident
        ($($field:ident : $fty:ty),*) -> $reply:ty) => {
        $(#[$doc])*
        /// `bulk_len`: the bytes of bulk data that follow, which the method reads or skips.
        #[allow(clippy::too_many_arguments)]
        fn $method(&mut self, $($field: $fty,)* bulk_len: u64) -> Result<$reply, Self::End>;
    };
    (@server_method wait [] $(#[$doc:meta])* $Status:ty, $method:ident
        ($($field:ident : $fty:ty),*) -> $reply:ty) => {
        $(#[$doc])*
        /// Sends the reply to `seq` itself (`reply`), now or when the work it waits for ends.
        #[allow(clippy::too_many_arguments)]
        fn $method(&mut self, seq: u64, $($field: $fty),*) -> Result<(), Self::End>;
    };
    (@server_method post [] $(#[$doc:meta])* $Status:ty, $method:ident
        ($($field:ident : $fty:ty),*)) => {
        $(#[$doc])*
        /// A failure is deferred to the next synchronizing call.
        #[allow(clippy::too_many_arguments)]
        fn $method(&mut self, $($field: $fty),*) -> Result<(), $Status>;
    };
    (@server_method post [bulk] $(#[$doc:meta])* $Status:ty, $method:ident
        ($($field:ident : $fty:ty),*)) => {
        $(#[$doc])*
        /// `bulk_len`: the bytes of bulk data that follow, which the method reads or skips. A
        /// failure (the inner `Err`) is deferred to the next synchronizing call.
        #[allow(clippy::too_many_arguments)]
        fn $method(
            &mut self,
            $($field: $fty,)*
            bulk_len: u64,
        ) -> Result<Result<(), $Status>, Self::End>;
    };
    (@server_method read [] $(#[$doc:meta])* $Status:ty, $method:ident
        ($($field:ident : $fty:ty),*)) => {
        $(#[$doc])*
        /// Sends the data of the read `seq` and its end itself, now or later.
        #[allow(clippy::too_many_arguments)]
        fn $method(&mut self, seq: u64, $($field: $fty),*) -> Result<(), Self::End>;
    };

    // Dispatch arms.
    (@dispatch call [] $server:ident $seq:ident $bulk_len:ident $Reply:ident $Variant:ident
        $method:ident ($($field:ident),*)) => {{
        let reply = $server.$method($($field),*);
        $server.reply($seq, $Reply::$Variant(reply))
    }};
    (@dispatch call [bulk] $server:ident $seq:ident $bulk_len:ident $Reply:ident
        $Variant:ident $method:ident ($($field:ident),*)) => {{
        let reply = $server.$method($($field,)* $bulk_len)?;
        $server.reply($seq, $Reply::$Variant(reply))
    }};
    (@dispatch wait [] $server:ident $seq:ident $bulk_len:ident $Reply:ident $Variant:ident
        $method:ident ($($field:ident),*)) => {
        $server.$method($seq, $($field),*)
    };
    (@dispatch post [] $server:ident $seq:ident $bulk_len:ident $Reply:ident $Variant:ident
        $method:ident ($($field:ident),*)) => {{
        if let Err(status) = $server.$method($($field),*) {
            $server.defer(stringify!($Variant), status);
        }
        Ok(())
    }};
    (@dispatch post [bulk] $server:ident $seq:ident $bulk_len:ident $Reply:ident
        $Variant:ident $method:ident ($($field:ident),*)) => {{
        if let Err(status) = $server.$method($($field,)* $bulk_len)? {
            $server.defer(stringify!($Variant), status);
        }
        Ok(())
    }};
    (@dispatch read [] $server:ident $seq:ident $bulk_len:ident $Reply:ident $Variant:ident
        $method:ident ($($field:ident),*)) => {
        $server.$method($seq, $($field),*)
    };
}
