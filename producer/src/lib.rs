//! producer: placeholder until its issue lands.
