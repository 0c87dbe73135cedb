//! The broker client (owned by the broker work).
