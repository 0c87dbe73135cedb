//! The properties: their names, and what each checks of a state.

use super::{Config, State};
use stateright::Property;

pub const UNIQUE: &str = "IDs are unique";
pub const LINEARIZABLE: &str = "an ID requested after another returned is larger";
pub const ONE_PER_TERM: &str = "at most one broker serves per term";
pub const STEPPED_DOWN: &str = "a broker that does not lead starts no request";
pub const TERMS_GROW: &str = "a broker's term never goes back";
pub const REDIRECT_CURRENT: &str = "a redirect never names a superseded leader";
pub const ANSWERED: &str = "a request is answered";
pub const FROM_WINDOW: &str = "a request is answered from a confirmed window";
pub const FAILOVER: &str = "a request is answered by a leader of term 2";
/// Only with [`Config::liveness`](crate::Config::liveness).
pub const LIVE: &str = "once faults stop, a request is answered within the bound";

/// The safety properties (`always`).
pub const SAFETY: [&str; 6] = [
    UNIQUE,
    LINEARIZABLE,
    ONE_PER_TERM,
    STEPPED_DOWN,
    TERMS_GROW,
    REDIRECT_CURRENT,
];

/// The safety properties that hold of `s`'s history so far: the names of those broken.
pub fn broken(s: &State) -> Vec<&'static str> {
    let g = &s.ghost;
    let flags = [
        g.duplicate,
        g.out_of_order,
        g.two_in_a_term,
        g.admitted_not_leading,
        g.term_went_back,
        g.stale_redirect,
    ];
    SAFETY
        .iter()
        .zip(flags)
        .filter(|(_, f)| *f)
        .map(|(p, _)| *p)
        .collect()
}

/// Every property `Config` checks (its `Model::properties`).
pub(super) fn all(cfg: &Config) -> Vec<Property<Config>> {
    let mut ps = vec![
        Property::always(UNIQUE, |_, s: &State| !s.ghost.duplicate),
        Property::always(LINEARIZABLE, |_, s: &State| !s.ghost.out_of_order),
        Property::always(ONE_PER_TERM, |_, s: &State| !s.ghost.two_in_a_term),
        Property::always(STEPPED_DOWN, |_, s: &State| !s.ghost.admitted_not_leading),
        Property::always(TERMS_GROW, |_, s: &State| !s.ghost.term_went_back),
        Property::always(REDIRECT_CURRENT, |_, s: &State| !s.ghost.stale_redirect),
        Property::sometimes(ANSWERED, |_, s: &State| s.ghost.answered > 0),
        Property::sometimes(FROM_WINDOW, |_, s: &State| s.ghost.answered_from_window),
        Property::sometimes(FAILOVER, |_, s: &State| s.ghost.answered_in_term_2),
    ];
    if cfg.liveness.is_some() {
        ps.push(Property::always(LIVE, |cfg: &Config, s: &State| {
            cfg.liveness
                .is_none_or(|steps| cfg.quiet_run(s, steps).answered)
        }));
    }
    ps
}
