//! The model (docs/model.md), one file an idea:
//! - what it is made of: the messages (`msg`), what each actor holds and the ghost the
//!   properties read (`state`), the bounds and the rules under check (`config`);
//! - each actor's steps, on the state being changed (`ctx`, which also delivers): Redis
//!   nodes (`node`), clients (`client`), a broker serving from its window (`window`) and
//!   in the election (`election`);
//! - the steps (`action`), which are enabled in a state and what one does (`transition`,
//!   the `stateright::Model`);
//! - the properties (`props`), the fault-free run the liveness check takes (`quiet`), and
//!   the scripts the tests start from (`script`).

mod action;
mod client;
mod config;
mod ctx;
mod election;
mod msg;
mod node;
pub mod props;
mod quiet;
pub mod script;
mod state;
mod transition;
mod window;

pub use action::Action;
pub use client::MAX_REDIRECTS;
pub use config::{Config, Sabotage, Step};
pub use msg::{Addr, Env, Hb, Msg, Tag};
pub use props::broken;
pub use quiet::QuietRun;
pub use state::{
    Batch, Broker, Client, ElectKind, ElectOp, Ghost, Node, Pending, Role, Stage, State, Window,
};
