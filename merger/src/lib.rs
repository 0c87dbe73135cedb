//! merger: placeholder until its issue lands.
