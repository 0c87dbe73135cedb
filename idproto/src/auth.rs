//! The broker's shared-secret token (`idbroker --auth-token-file`, a client's
//! `--broker-token-file`): read from a file, compared in constant time, and never shown
//! (its `Debug` prints `Token(<redacted>)`, it has no `Display`).

use std::path::Path;

/// A shared secret. Reading it is [`Token::as_str`]'s, on purpose explicit.
#[derive(Clone, PartialEq, Eq)]
pub struct Token(String);

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(<redacted>)")
    }
}

impl Token {
    /// A token from its text, trimmed; `None` when nothing is left.
    pub fn new(text: &str) -> Option<Token> {
        let t = text.trim();
        (!t.is_empty()).then(|| Token(t.to_string()))
    }

    /// Reads the token from `path`: the file's content, trimmed.
    ///
    /// # Errors
    /// A message naming the file (never its content) if it cannot be read, is not
    /// UTF-8, or holds only white space.
    pub fn from_file(path: &Path) -> Result<Token, String> {
        let text = std::fs::read(path)
            .map_err(|e| format!("cannot read token file {}: {e}", path.display()))?;
        let text = String::from_utf8(text)
            .map_err(|_| format!("token file {} is not UTF-8 text", path.display()))?;
        Token::new(&text).ok_or_else(|| format!("token file {} is empty", path.display()))
    }

    /// True when the file at `path` may be read by its group or others (Unix modes).
    pub fn file_is_shared(path: &Path) -> bool {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(path).is_ok_and(|m| m.permissions().mode() & 0o077 != 0)
    }

    /// The secret itself, to send it.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether `presented` is this token, in time that depends only on the lengths:
    /// every byte is compared, so timing tells an attacker nothing about the prefix
    /// they got right.
    pub fn matches(&self, presented: &[u8]) -> bool {
        let want = self.0.as_bytes();
        let mut diff = u8::from(want.len() != presented.len());
        for (i, w) in want.iter().enumerate() {
            // Compare against something of the same cost when the lengths differ.
            let p = presented.get(i).copied().unwrap_or(!w);
            diff |= w ^ p;
        }
        std::hint::black_box(diff) == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_only_the_same_bytes() {
        let t = Token::new(" s3cret\n").expect("token");
        assert_eq!(t.as_str(), "s3cret");
        assert!(t.matches(b"s3cret"));
        for wrong in [&b""[..], b"s3cre", b"s3cret!", b"S3cret", b"x"] {
            assert!(!t.matches(wrong), "{wrong:?}");
        }
        assert!(Token::new(" \n\t").is_none());
    }

    #[test]
    fn debug_never_shows_the_secret() {
        let t = Token::new("hunter2").expect("token");
        assert!(!format!("{t:?}").contains("hunter2"));
        assert!(!format!("{:?}", Some(t)).contains("hunter2"));
    }

    #[test]
    fn file_errors_name_the_file_not_the_content() {
        let dir = std::env::temp_dir().join(format!("idproto-token-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let empty = dir.join("empty");
        std::fs::write(&empty, "  \n").expect("write");
        let e = Token::from_file(&empty).expect_err("empty");
        assert!(
            e.contains("empty") && e.contains(&empty.display().to_string()),
            "{e}"
        );
        let missing = dir.join("missing");
        let e = Token::from_file(&missing).expect_err("missing");
        assert!(e.contains(&missing.display().to_string()), "{e}");
        let good = dir.join("good");
        std::fs::write(&good, "hunter2\n").expect("write");
        assert_eq!(Token::from_file(&good).expect("good").as_str(), "hunter2");
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }
}
