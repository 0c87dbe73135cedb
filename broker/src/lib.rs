//! broker: placeholder until its issue lands.
