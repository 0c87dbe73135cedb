//! Node connections.
