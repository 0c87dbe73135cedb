//! The conditional-write Lua script.
