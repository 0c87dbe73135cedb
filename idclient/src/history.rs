//! History checker.
