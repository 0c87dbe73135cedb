//! The conditional write ("set if less than") as one Lua script, and exact u64 parsing.
//!
//! Redis Lua numbers are doubles, exact only below 2^53, so the script never does
//! arithmetic and never converts the register to a number: it validates the stored string
//! as a canonical decimal u64 and compares by length, then lexicographically (equal-length
//! canonical decimals order like their values).

/// `KEYS[1]` = register, `ARGV[1]` = LO, `ARGV[2]` = HI (canonical decimals, LO <= HI).
///
/// If the register (missing = 0) is below LO it becomes HI and the reply is `{1, HI}`;
/// otherwise nothing changes and the reply is `{0, current}`. A register that is not a
/// canonical decimal u64 (or not a string) gives the error `QLISTBAD <value>`.
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
if less then
  redis.call('SET', KEYS[1], ARGV[2])
  return {1, ARGV[2]}
end
return {0, cur}
"#;

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
        for bad in [&b""[..], b"foo", b"-1", b"007", b"00", b"+1", b" 1", b"1 ", b"1.0", b"18446744073709551616", b"99999999999999999999", b"123456789012345678901"] {
            assert_eq!(parse_canonical_u64(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
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
