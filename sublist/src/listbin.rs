//! list.bin (owned by the merger work).
