//! [`Location`]: a local directory or file, or an S3 prefix or object.

use std::fmt;
use std::path::PathBuf;

use crate::StoreError;

/// The one object-store scheme qlist speaks.
const S3_SCHEME: &str = "s3://";

/// A place runs live, or one run in it: a local path, or `s3://bucket/prefix`.
///
/// The same type names a directory and a file in it (or a prefix and an object under it):
/// [`Location::join`] goes from the first to the second.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Location {
    /// A local (or mounted) path.
    Dir(PathBuf),
    /// An S3 bucket and a key or key prefix, without leading or trailing '/' (may be empty).
    S3 {
        /// The bucket's name.
        bucket: String,
        /// The key or key prefix within it; empty for the whole bucket.
        prefix: String,
    },
}

impl Location {
    /// Parses `s3://bucket/some/prefix` (the prefix may be empty; trailing '/' are
    /// trimmed) or a local path.
    ///
    /// # Errors
    /// [`StoreError::BadLocation`] for an empty string, `s3://` without a bucket, a bucket
    /// with credentials or a port in it, or any other scheme (`gs://`, `http://`, ...).
    pub fn parse(s: &str) -> Result<Location, StoreError> {
        let bad = |reason: &str| StoreError::BadLocation {
            input: mask_userinfo(s),
            reason: reason.to_string(),
        };
        if s.is_empty() {
            return Err(bad("empty: give a local path or s3://bucket/prefix"));
        }
        if let Some(rest) = s.strip_prefix(S3_SCHEME) {
            let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
            check_bucket(bucket).map_err(|reason| bad(&reason))?;
            let prefix = prefix.trim_matches('/');
            if prefix.split('/').any(|p| p == "." || p == "..") || prefix.contains("//") {
                return Err(bad("the prefix must not hold '.', '..' or empty parts"));
            }
            return Ok(Location::S3 {
                bucket: bucket.to_string(),
                prefix: prefix.to_string(),
            });
        }
        if looks_like_a_mistyped_url(s) {
            return Err(bad(
                "a scheme without '//' after it: write s3://bucket/prefix, or ./NAME for a local directory",
            ));
        }
        if let Some((scheme, _)) = s.split_once("://") {
            let reason = format!(
                "unsupported scheme {scheme}://: use a local path or s3://bucket/prefix \
                 (other object stores through their S3 API and AWS_ENDPOINT_URL)"
            );
            return Err(bad(&reason));
        }
        Ok(Location::Dir(PathBuf::from(s)))
    }

    /// The file or object called `name` inside this directory or prefix.
    pub fn join(&self, name: &str) -> Location {
        match self {
            Location::Dir(dir) => Location::Dir(dir.join(name)),
            Location::S3 { bucket, prefix } => {
                let name = name.trim_matches('/');
                let prefix = match (prefix.is_empty(), name.is_empty()) {
                    (true, _) => name.to_string(),
                    (false, true) => prefix.clone(),
                    (false, false) => format!("{prefix}/{name}"),
                };
                Location::S3 {
                    bucket: bucket.clone(),
                    prefix,
                }
            }
        }
    }

    /// Whether this is an S3 location.
    pub fn is_s3(&self) -> bool {
        matches!(self, Location::S3 { .. })
    }

    /// The last part of the path or key ("" for a bucket's root).
    pub fn name(&self) -> &str {
        match self {
            Location::Dir(p) => p.file_name().and_then(|n| n.to_str()).unwrap_or(""),
            Location::S3 { prefix, .. } => prefix.rsplit('/').next().unwrap_or(""),
        }
    }
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Location::Dir(p) => write!(f, "{}", p.display()),
            Location::S3 { bucket, prefix } if prefix.is_empty() => write!(f, "s3://{bucket}"),
            Location::S3 { bucket, prefix } => write!(f, "s3://{bucket}/{prefix}"),
        }
    }
}

/// A bucket name as S3 allows it, loosely (S3-compatible stores differ): no credentials,
/// no port, no spaces.
fn check_bucket(bucket: &str) -> Result<(), String> {
    if bucket.is_empty() {
        return Err("no bucket: write s3://bucket or s3://bucket/prefix".to_string());
    }
    if bucket.contains('@') || bucket.contains(':') {
        return Err(
            "credentials or a port do not belong in the location: credentials come \
                    from AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, the endpoint from \
                    AWS_ENDPOINT_URL"
                .to_string(),
        );
    }
    let ok = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_');
    if !bucket.chars().all(ok) {
        return Err(format!(
            "bucket {bucket:?}: only letters, digits, '-', '.' and '_' are allowed"
        ));
    }
    Ok(())
}

/// `scheme://user:pass@host/...` with the `user:pass` part replaced, so that a credential
/// pasted into a location never reaches an error message.
pub(crate) fn mask_userinfo(s: &str) -> String {
    let Some((scheme, rest)) = s.split_once("://") else {
        return s.to_string();
    };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    match rest[..authority_end].rfind('@') {
        Some(at) => format!("{scheme}://***@{}", &rest[at + 1..]),
        None => s.to_string(),
    }
}

/// `s3:/x`, `s3:bucket`, `gs:/b`: a scheme followed by one slash or none, which would
/// otherwise be taken for a relative local directory named `s3:`.
fn looks_like_a_mistyped_url(s: &str) -> bool {
    match s.split_once(':') {
        Some((scheme, rest)) => {
            !scheme.is_empty()
                && scheme.chars().all(|c| c.is_ascii_alphanumeric())
                && !rest.starts_with("//")
        }
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[track_caller]
    fn s3(input: &str, bucket: &str, prefix: &str) {
        let loc = Location::parse(input).unwrap();
        let want = Location::S3 {
            bucket: bucket.into(),
            prefix: prefix.into(),
        };
        assert_eq!(loc, want, "{input}");
        assert!(loc.is_s3());
    }

    #[track_caller]
    fn bad(input: &str, needle: &str) {
        let e = Location::parse(input).unwrap_err().to_string();
        assert!(e.contains(needle), "{input}: {e}");
    }

    #[test]
    fn parses_s3() {
        s3("s3://bucket", "bucket", "");
        s3("s3://bucket/", "bucket", "");
        s3("s3://bucket/runs", "bucket", "runs");
        s3("s3://bucket/runs/", "bucket", "runs");
        s3("s3://b-1.x/a/b/c//", "b-1.x", "a/b/c");
    }

    #[test]
    fn parses_paths() {
        let loc = Location::parse("/tmp/runs").unwrap();
        assert_eq!(loc, Location::Dir(PathBuf::from("/tmp/runs")));
        assert!(!loc.is_s3());
        assert_eq!(
            Location::parse("runs").unwrap(),
            Location::Dir("runs".into())
        );
    }

    #[test]
    fn rejects_bad() {
        bad("", "empty");
        bad("s3://", "no bucket");
        bad("s3:///prefix", "no bucket");
        bad("gs://bucket/x", "unsupported scheme gs://");
        bad("http://host/x", "unsupported scheme http://");
        bad("s3://bucket/a/../b", "'..'");
        bad("s3://bu cket/a", "only letters");
    }

    #[test]
    fn never_echoes_credentials() {
        let e = Location::parse("s3://AKID:SECRET-sentinel-123@bucket/x").unwrap_err();
        let text = format!("{e} {e:?}");
        assert!(!text.contains("SECRET-sentinel-123"), "{text}");
        assert!(text.contains("credentials"), "{text}");
        let e = Location::parse("gs://u:SECRET-sentinel-123@h/x").unwrap_err();
        assert!(!format!("{e} {e:?}").contains("SECRET-sentinel-123"));
    }

    #[test]
    fn join_and_display() {
        let root = Location::parse("s3://b").unwrap();
        assert_eq!(root.to_string(), "s3://b");
        let runs = root.join("runs");
        assert_eq!(runs.to_string(), "s3://b/runs");
        let run = runs.join("shard-3.bin");
        assert_eq!(run.to_string(), "s3://b/runs/shard-3.bin");
        assert_eq!(run.name(), "shard-3.bin");
        let dir = Location::parse("/data/runs").unwrap();
        assert_eq!(
            dir.join("shard-3.bin").to_string(),
            "/data/runs/shard-3.bin"
        );
        assert_eq!(dir.join("shard-3.bin").name(), "shard-3.bin");
    }
}
