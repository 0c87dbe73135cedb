//! The idbroker wire protocol (owned by the broker work).
