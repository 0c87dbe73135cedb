//! The conditional write ("set if less than") as one Lua script, and exact u64 parsing.
//!
//! Redis Lua numbers are doubles, exact only below 2^53, so the script never does
//! arithmetic and never converts the register to a number: it validates the stored string
//! as a canonical decimal u64 and compares by length, then lexicographically (equal-length
//! canonical decimals order like their values).

/// `KEYS[1]` = register, `KEYS[2]` = the rendezvous' in-flight mark (see [`COMBINE`]),
/// `ARGV[1]` = LO, `ARGV[2]` = HI (canonical decimals, LO <= HI), `ARGV[3]` = the nonce
/// of the batch this write is for, or empty.
///
/// If the register (missing = 0) is below LO it becomes HI and the reply is
/// `{1, HI, combining}`; otherwise nothing changes and the reply is
/// `{0, current, combining}`. `combining` is 1 when another combined batch than `ARGV[3]`
/// is in flight at this node (only the rendezvous node ever has one), else 0: a hint
/// that tells a writer it is not alone, never part of the decision (a mark that is not a
/// nonce, or has no expiry or one above [`MAX_RENDEZVOUS_TTL_MS`], or of the wrong
/// type, is no hint at all: see [`COMBINE`] on stray keys). A
/// register that is not a canonical decimal u64 (or not a string) gives the error
/// `QLISTBAD <value>`.
pub const CONDITIONAL_WRITE: &str = r#"
local t = redis.call('TYPE', KEYS[1]).ok
if t ~= 'string' and t ~= 'none' then
  return redis.error_reply('QLISTBAD (a ' .. t .. ', not a string)')
end
local cur = redis.call('GET', KEYS[1])
if cur == false then cur = '0' end
local n = #cur
local ok = n >= 1 and n <= 20 and string.find(cur, '^[0-9]+$') ~= nil
  and not (n > 1 and string.byte(cur, 1) == 48)
  and not (n == 20 and cur > '18446744073709551615')
if not ok then
  return redis.error_reply('QLISTBAD ' .. string.sub(cur, 1, 64))
end
local lo = ARGV[1]
local less = (n < #lo) or (n == #lo and cur < lo)
local busy = redis.pcall('GET', KEYS[2])
local combining = 0
if type(busy) == 'string' and #busy == 32 and busy ~= ARGV[3] then
  local pttl = redis.call('PTTL', KEYS[2])
  if pttl >= 0 and pttl <= 60000 then combining = 1 end
end
if less then
  redis.call('SET', KEYS[1], ARGV[2])
  return {1, ARGV[2], combining}
end
return {0, cur, combining}
"#;

/// Rendezvous of combined rounds on one node (see `combine.rs`, docs/idclient.md).
/// Volatile: `redis.set_repl(REPL_NONE)` keeps all of it out of the AOF (no fsync) and
/// every key has an expiry. It never touches the register: safety never depends on it.
///
/// `KEYS[1]` = the open batch (hash: `nonce`, `ids`), `KEYS[2]` = the batch in flight
/// (string: its nonce), `KEYS[3]` = the results channel. `ARGV[1]` is the operation:
///
/// - `join n nonce round_ms max_ids batch_ms`: if a batch is open, add `n` IDs to it:
///   `{1, batch nonce, offset, pttl}` (offset = its IDs before; pttl = what is left of
///   its leader's lease), or `{0}` when that would exceed `max_ids`. Else, if no batch is
///   in flight, the caller's batch (its request alone) is in flight at once, for
///   `round_ms`: `{2}`. Else the caller opens a batch, for `batch_ms`, and leads it:
///   `{3, nonce in flight, its pttl}`.
/// - `close nonce round_ms`: the leader of the open batch closes it when nothing is in
///   flight, and it is in flight for `round_ms`: `{1, ids}`; `{3, nonce in flight,
///   pttl}` while something is; `{0}` when the batch is gone (expired, node restarted).
/// - `finish nonce message`: the batch is done: clear the in-flight mark if it is this
///   batch's, publish `message` on the channel. `{1}`.
///
/// Stray keys: before any operation, a key of the rendezvous that the protocol could not
/// have written (wrong type, no expiry, an expiry above [`MAX_RENDEZVOUS_TTL_MS`], a
/// value that is not a nonce, a batch without a count) is deleted, and that delete is
/// logged to the AOF so the repair survives a restart. A `SET current:inflight x` typed
/// by hand must not hold every batch forever.
///
/// Counts stay below 2^53, so Lua's numbers hold them exactly; nonces stay strings.
pub const COMBINE: &str = r#"
local LIMIT = 60000
local function nonce(v)
  return type(v) == 'string' and #v == 32 and string.find(v, '^[0-9a-f]+$') ~= nil
end
local function repair(key, kind)
  local t = redis.call('TYPE', key).ok
  if t == 'none' then return end
  local pttl = redis.call('PTTL', key)
  local ok = t == kind and pttl >= 0 and pttl <= LIMIT
  if ok and kind == 'string' then ok = nonce(redis.call('GET', key)) end
  if ok and kind == 'hash' then
    local ids = redis.call('HGET', key, 'ids')
    ok = nonce(redis.call('HGET', key, 'nonce')) and type(ids) == 'string'
      and string.find(ids, '^[0-9]+$') ~= nil and #ids <= 15
  end
  if not ok then redis.call('DEL', key) end
end
repair(KEYS[1], 'hash')
repair(KEYS[2], 'string')
redis.set_repl(redis.REPL_NONE)
local op = ARGV[1]
if op == 'join' then
  if redis.call('EXISTS', KEYS[1]) == 1 then
    local ids = tonumber(redis.call('HGET', KEYS[1], 'ids'))
    if ids == nil or ids + tonumber(ARGV[2]) > tonumber(ARGV[5]) then return {0} end
    redis.call('HINCRBY', KEYS[1], 'ids', ARGV[2])
    return {1, redis.call('HGET', KEYS[1], 'nonce'), tostring(ids), redis.call('PTTL', KEYS[1])}
  end
  if redis.call('EXISTS', KEYS[2]) == 0 then
    redis.call('SET', KEYS[2], ARGV[3], 'PX', ARGV[4])
    return {2}
  end
  redis.call('HSET', KEYS[1], 'nonce', ARGV[3], 'ids', ARGV[2])
  redis.call('PEXPIRE', KEYS[1], ARGV[6])
  return {3, redis.call('GET', KEYS[2]), redis.call('PTTL', KEYS[2])}
elseif op == 'close' then
  if redis.call('HGET', KEYS[1], 'nonce') ~= ARGV[2] then return {0} end
  if redis.call('EXISTS', KEYS[2]) == 1 then
    return {3, redis.call('GET', KEYS[2]), redis.call('PTTL', KEYS[2])}
  end
  local ids = redis.call('HGET', KEYS[1], 'ids')
  redis.call('DEL', KEYS[1])
  redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3])
  return {1, ids}
elseif op == 'finish' then
  if redis.call('GET', KEYS[2]) == ARGV[2] then redis.call('DEL', KEYS[2]) end
  redis.call('PUBLISH', KEYS[3], ARGV[3])
  return {1}
end
return redis.error_reply('ERR unknown rendezvous operation')
"#;

/// The longest expiry the rendezvous script leaves on a key it keeps (the `LIMIT` in
/// [`COMBINE`]): clients never ask for more (their leases are capped by
/// `quorum::MAX_LEASE`), so a key that holds longer was not written by the
/// protocol and is deleted as stray.
pub const MAX_RENDEZVOUS_TTL_MS: u64 = 60_000;

/// The error code the script uses for a register that is not a canonical decimal u64.
pub const BAD_VALUE_CODE: &str = "QLISTBAD";

/// Parses a canonical decimal u64: ASCII digits only, no sign, no leading zero (except
/// "0" itself), at most u64::MAX. Anything else is `None`, never 0.
pub fn parse_canonical_u64(bytes: &[u8]) -> Option<u64> {
    if bytes.is_empty() || bytes.len() > 20 || !bytes.iter().all(u8::is_ascii_digit) {
        return None;
    }
    if bytes.len() > 1 && bytes[0] == b'0' {
        return None;
    }
    std::str::from_utf8(bytes).ok()?.parse::<u64>().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn canonical_values() {
        assert_eq!(parse_canonical_u64(b"0"), Some(0));
        assert_eq!(parse_canonical_u64(b"42"), Some(42));
        assert_eq!(parse_canonical_u64(b"18446744073709551615"), Some(u64::MAX));
        assert_eq!(parse_canonical_u64(b"9223372036854775808"), Some(1 << 63));
    }

    #[test]
    fn non_canonical_values_are_rejected_not_zero() {
        for bad in [
            &b""[..],
            b"foo",
            b"-1",
            b"007",
            b"00",
            b"+1",
            b" 1",
            b"1 ",
            b"1.0",
            b"18446744073709551616",
            b"99999999999999999999",
            b"123456789012345678901",
        ] {
            assert_eq!(
                parse_canonical_u64(bad),
                None,
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn the_script_and_the_client_agree_on_the_ttl_limit() {
        assert!(COMBINE.contains(&format!("local LIMIT = {MAX_RENDEZVOUS_TTL_MS}\n")));
        assert!(CONDITIONAL_WRITE.contains(&format!("pttl <= {MAX_RENDEZVOUS_TTL_MS} then")));
        // That client leases fit below it is checked where they are defined (quorum/combining.rs).
    }

    proptest! {
        #[test]
        fn round_trips_every_u64(v: u64) {
            prop_assert_eq!(parse_canonical_u64(v.to_string().as_bytes()), Some(v));
        }

        // The script's comparison (length, then bytes) must agree with numeric order.
        #[test]
        fn length_then_lexicographic_is_numeric_order(a: u64, b: u64) {
            let (sa, sb) = (a.to_string(), b.to_string());
            let less = sa.len() < sb.len() || (sa.len() == sb.len() && sa < sb);
            prop_assert_eq!(less, a < b);
        }
    }
}
