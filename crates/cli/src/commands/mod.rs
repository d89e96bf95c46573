//! One module per subcommand.

pub mod bench;
pub mod devices;
pub mod run;
pub mod server;
pub mod token;
