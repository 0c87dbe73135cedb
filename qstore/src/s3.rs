//! S3: configuration from the environment, one client per bucket, and every request
//! wrapped in a retry loop bounded by the operation's deadline.

use std::future::Future;
use std::ops::Range;
use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::StreamExt;
use object_store::aws::{AmazonS3, AmazonS3Builder, AmazonS3ConfigKey};
use object_store::multipart::{MultipartStore, PartId};
use object_store::path::Path;
use object_store::{
    BackoffConfig, ClientOptions, GetOptions, GetRange, ObjectMeta, ObjectStore, ObjectStoreExt,
    PutPayload, RetryConfig,
};
use tracing::debug;

use crate::error::chain;
use crate::location::mask_userinfo;
use crate::tasks::ReadBuffers;
use crate::{StoreError, StoreOptions};

/// First pause after a transient failure: long enough for a restarting server's socket
/// to come back, short enough that a single dropped connection costs little.
const BACKOFF_FIRST: Duration = Duration::from_millis(100);
/// Longest pause between tries: the deadline, not the pause, bounds the total wait.
const BACKOFF_MAX: Duration = Duration::from_secs(2);
/// object_store's own retries per request; generous because its `retry_timeout` (set to
/// the operation's deadline) is what really bounds them.
const CLIENT_MAX_RETRIES: usize = 100;
/// A TCP/TLS connect that takes longer is a dead or unreachable endpoint.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// One request, body included: a 8 MiB part or a 4 MiB range at a slow ~300 KB/s.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// The region S3 tools assume when AWS_REGION is unset.
const DEFAULT_REGION: &str = "us-east-1";
/// Other credential sources object_store understands (web identity / IRSA, ECS and EKS
/// container credentials), passed through as they are when no static key is given.
const OTHER_CREDENTIAL_VARS: [&str; 7] = [
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_ROLE_ARN",
    "AWS_ROLE_SESSION_NAME",
    "AWS_ENDPOINT_URL_STS",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE",
];

/// A secret string: no `Display`, and `Debug` prints stars.
#[derive(Clone)]
struct Secret(String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("\"***\"")
    }
}

/// How to reach S3: credentials, region, endpoint. Its `Debug` never shows a secret.
#[derive(Clone, Debug)]
pub struct S3Config {
    access_key_id: Option<String>,
    secret_access_key: Option<Secret>,
    session_token: Option<Secret>,
    region: String,
    endpoint: Option<String>,
    allow_http: bool,
    other: Vec<(AmazonS3ConfigKey, String)>,
}

impl S3Config {
    /// Static credentials, region us-east-1, AWS's own endpoint.
    pub fn new(access_key_id: &str, secret_access_key: &str) -> S3Config {
        S3Config {
            access_key_id: Some(access_key_id.to_string()),
            secret_access_key: Some(Secret(secret_access_key.to_string())),
            session_token: None,
            region: DEFAULT_REGION.to_string(),
            endpoint: None,
            allow_http: false,
            other: Vec::new(),
        }
    }

    /// The same with a session token (temporary credentials).
    pub fn with_session_token(mut self, token: &str) -> S3Config {
        self.session_token = Some(Secret(token.to_string()));
        self
    }

    /// The region to sign requests for.
    pub fn with_region(mut self, region: &str) -> S3Config {
        self.region = region.to_string();
        self
    }

    /// An S3-compatible endpoint (MinIO, SeaweedFS, ...), e.g. `http://127.0.0.1:8333`;
    /// requests are then path-style (`endpoint/bucket/key`).
    pub fn with_endpoint(mut self, endpoint: &str) -> S3Config {
        self.endpoint = Some(endpoint.to_string());
        self
    }

    /// Whether a plain `http://` endpoint is allowed.
    pub fn with_allow_http(mut self, allow: bool) -> S3Config {
        self.allow_http = allow;
        self
    }

    /// Reads the variables every S3 tool reads: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
    /// AWS_SESSION_TOKEN, AWS_REGION (or AWS_DEFAULT_REGION; else us-east-1),
    /// AWS_ENDPOINT_URL (or AWS_ENDPOINT), AWS_ALLOW_HTTP; without a static key, the
    /// web-identity and container credential variables.
    ///
    /// # Errors
    /// [`StoreError::Config`] when only one half of the key is set, AWS_ALLOW_HTTP is not a
    /// boolean, or the endpoint is not an http(s) URL (or is http without AWS_ALLOW_HTTP).
    pub fn from_env() -> Result<S3Config, StoreError> {
        S3Config::from_vars(|name| std::env::var(name).ok())
    }

    /// [`S3Config::from_env`] over any source of variables (tests, config files).
    ///
    /// # Errors
    /// As [`S3Config::from_env`].
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<S3Config, StoreError> {
        let var = |name: &str| get(name).filter(|v| !v.is_empty());
        let config = |message: String| StoreError::Config { message };
        let (key, secret) = (var("AWS_ACCESS_KEY_ID"), var("AWS_SECRET_ACCESS_KEY"));
        let token = var("AWS_SESSION_TOKEN");
        match (&key, &secret) {
            (Some(_), None) => {
                return Err(config(
                    "AWS_ACCESS_KEY_ID is set but AWS_SECRET_ACCESS_KEY is not".into(),
                ))
            }
            (None, Some(_)) => {
                return Err(config(
                    "AWS_SECRET_ACCESS_KEY is set but AWS_ACCESS_KEY_ID is not".into(),
                ))
            }
            (None, None) if token.is_some() => {
                return Err(config(
                    "AWS_SESSION_TOKEN is set without AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"
                        .into(),
                ))
            }
            _ => {}
        }
        let allow_http = match var("AWS_ALLOW_HTTP").map(|v| v.to_ascii_lowercase()) {
            None => false,
            Some(v) if v == "true" || v == "1" => true,
            Some(v) if v == "false" || v == "0" => false,
            Some(v) => {
                return Err(config(format!(
                    "AWS_ALLOW_HTTP is {v:?}: use true or false"
                )))
            }
        };
        let mut other = Vec::new();
        if key.is_none() {
            for name in OTHER_CREDENTIAL_VARS {
                if let Some(value) = var(name) {
                    let k = AmazonS3ConfigKey::from_str(&name.to_ascii_lowercase())
                        .map_err(|e| config(format!("{name}: {e}")))?;
                    other.push((k, value));
                }
            }
        }
        Ok(S3Config {
            access_key_id: key,
            secret_access_key: secret.map(Secret),
            session_token: token.map(Secret),
            region: var("AWS_REGION")
                .or_else(|| var("AWS_DEFAULT_REGION"))
                .unwrap_or_else(|| DEFAULT_REGION.to_string()),
            endpoint: var("AWS_ENDPOINT_URL").or_else(|| var("AWS_ENDPOINT")),
            allow_http,
            other,
        })
    }

    /// Checks the endpoint's scheme against AWS_ALLOW_HTTP.
    fn check_endpoint(&self) -> Result<(), StoreError> {
        let Some(endpoint) = &self.endpoint else {
            return Ok(());
        };
        let shown = mask_userinfo(endpoint);
        let message = if endpoint.starts_with("https://") {
            return Ok(());
        } else if endpoint.starts_with("http://") {
            if self.allow_http {
                return Ok(());
            }
            format!("endpoint {shown} is plain http: set AWS_ALLOW_HTTP=true to allow it")
        } else {
            format!("endpoint {shown} is not an http:// or https:// URL")
        };
        Err(StoreError::Config { message })
    }

    /// A client for one bucket, with the retry policy and timeouts of `opts`.
    pub(crate) fn client(&self, bucket: &str, opts: &StoreOptions) -> Result<AmazonS3, StoreError> {
        self.check_endpoint()?;
        let retry = RetryConfig {
            backoff: BackoffConfig {
                init_backoff: BACKOFF_FIRST,
                max_backoff: BACKOFF_MAX,
                base: 2.0,
            },
            max_retries: CLIENT_MAX_RETRIES,
            retry_timeout: opts.deadline,
        };
        let client_options = ClientOptions::new()
            .with_connect_timeout(CONNECT_TIMEOUT)
            .with_timeout(REQUEST_TIMEOUT)
            .with_allow_http(self.allow_http);
        let mut b = AmazonS3Builder::new()
            .with_bucket_name(bucket)
            .with_region(&self.region)
            .with_retry(retry)
            .with_client_options(client_options);
        if let (Some(id), Some(secret)) = (&self.access_key_id, &self.secret_access_key) {
            b = b.with_access_key_id(id).with_secret_access_key(&secret.0);
        }
        if let Some(token) = &self.session_token {
            b = b.with_token(&token.0);
        }
        for (k, v) in &self.other {
            b = b.with_config(*k, v);
        }
        if let Some(endpoint) = &self.endpoint {
            b = b
                .with_endpoint(endpoint)
                .with_virtual_hosted_style_request(false);
        }
        b.build().map_err(|e| StoreError::Config {
            message: format!("bucket {bucket}: {}", chain(&e)),
        })
    }
}

/// One S3 object (or prefix) and the client that reaches it.
#[derive(Clone)]
pub(crate) struct S3Target {
    pub client: Arc<AmazonS3>,
    pub key: Path,
    /// `s3://bucket/key`, for messages.
    pub name: Arc<str>,
    pub deadline: Duration,
}

/// How one try of a request ended, when it did not succeed.
pub(crate) enum Failure {
    /// Worth another try while the deadline lasts; the text says what happened.
    Transient(String),
    /// Retrying cannot help: not found, refused, changed, a malformed answer.
    Fatal(StoreError),
}

impl S3Target {
    /// Maps an object_store error: the kinds retrying cannot fix become a [`StoreError`].
    fn classify(&self, op: &str, e: &object_store::Error) -> Failure {
        use object_store::Error as E;
        let object = self.name.to_string();
        let op = op.to_string();
        // Some requests (listings, multipart) report every status as `Generic`.
        let status = http_status(&chain(e));
        match e {
            E::NotFound { .. } => Failure::Fatal(StoreError::NotFound { object }),
            E::Generic { .. } if status == Some(404) => {
                Failure::Fatal(StoreError::NotFound { object })
            }
            E::PermissionDenied { .. } | E::Unauthenticated { .. } => {
                let message = chain(e);
                Failure::Fatal(StoreError::Denied {
                    object,
                    op,
                    message,
                })
            }
            E::Generic { .. } if matches!(status, Some(401 | 403)) => {
                let message = chain(e);
                Failure::Fatal(StoreError::Denied {
                    object,
                    op,
                    message,
                })
            }
            E::Generic { .. } if is_transient(e) => Failure::Transient(chain(e)),
            _ => {
                let message = chain(e);
                Failure::Fatal(StoreError::S3 {
                    object,
                    op,
                    message,
                })
            }
        }
    }

    /// Runs `attempt` until it succeeds, fails for good, or the deadline passes.
    pub async fn retry<T, F, Fut>(&self, op: &str, mut attempt: F) -> Result<T, StoreError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, Failure>>,
    {
        let start = Instant::now();
        let mut pause = BACKOFF_FIRST;
        let mut tries = 0u32;
        loop {
            tries += 1;
            let left = self.deadline.saturating_sub(start.elapsed());
            let cause = match tokio::time::timeout(left, attempt()).await {
                Ok(Ok(v)) => return Ok(v),
                Ok(Err(Failure::Fatal(e))) => return Err(e),
                Ok(Err(Failure::Transient(cause))) => cause,
                Err(_) => format!("no answer within the {:?} deadline", self.deadline),
            };
            if start.elapsed() + pause >= self.deadline {
                return Err(StoreError::GaveUp {
                    object: self.name.to_string(),
                    op: op.to_string(),
                    tries,
                    elapsed: start.elapsed(),
                    cause,
                });
            }
            debug!(object = %self.name, op, tries, %cause, "transient S3 failure; retrying");
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(BACKOFF_MAX);
        }
    }

    /// HEAD: size and ETag, or `None` if there is no such object.
    pub async fn head(&self) -> Result<Option<ObjectMeta>, StoreError> {
        let res = self
            .retry("HEAD", || async {
                self.client
                    .head(&self.key)
                    .await
                    .map_err(|e| self.classify("HEAD", &e))
            })
            .await;
        match res {
            Ok(meta) => Ok(Some(meta)),
            Err(StoreError::NotFound { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// One ranged GET of the version whose ETag is `etag`: exactly `range`'s bytes, read
    /// into one of `buffers`.
    pub(crate) async fn get_range(
        &self,
        etag: Option<&str>,
        range: Range<u64>,
        buffers: &ReadBuffers,
    ) -> Result<Bytes, StoreError> {
        let op = format!("ranged read of bytes {}..{}", range.start, range.end);
        self.retry(&op, || {
            self.get_range_once(&op, etag, range.clone(), buffers)
        })
        .await
    }

    async fn get_range_once(
        &self,
        op: &str,
        etag: Option<&str>,
        range: Range<u64>,
        buffers: &ReadBuffers,
    ) -> Result<Bytes, Failure> {
        let want = range.end - range.start;
        let options = GetOptions {
            if_match: etag.map(str::to_string),
            range: Some(GetRange::Bounded(range)),
            ..GetOptions::default()
        };
        let changed = |now: &str| {
            Failure::Fatal(StoreError::Changed {
                object: self.name.to_string(),
                was: etag.unwrap_or("?").to_string(),
                now: now.to_string(),
            })
        };
        let res = match self.client.get_opts(&self.key, options).await {
            Ok(res) => res,
            Err(object_store::Error::Precondition { .. }) => {
                return Err(changed(
                    "different: the server answered 412 Precondition Failed",
                ))
            }
            Err(e) => return Err(self.classify(op, &e)),
        };
        if let (Some(was), Some(now)) = (etag, res.meta.e_tag.as_deref()) {
            if was != now {
                return Err(changed(now));
            }
        }
        let wrong_size = |sent: &str| {
            Failure::Fatal(StoreError::S3 {
                object: self.name.to_string(),
                op: op.to_string(),
                message: format!("the server sent {sent} bytes instead of {want}"),
            })
        };
        let want_len = usize::try_from(want).map_err(|_| wrong_size("?"))?;
        let mut body = buffers.take();
        body.clear();
        body.reserve(want_len);
        // The request was accepted: a failure now is the body cut short, worth a retry.
        let mut chunks = res.into_stream();
        while let Some(chunk) = chunks.next().await {
            let chunk = chunk.map_err(|e| Failure::Transient(chain(&e)))?;
            if chunk.len() > want_len - body.len() {
                return Err(wrong_size(&format!("more than {want}")));
            }
            body.extend_from_slice(&chunk);
        }
        if body.len() != want_len {
            return Err(wrong_size(&body.len().to_string()));
        }
        Ok(buffers.hand_out(body))
    }

    /// The objects directly under this prefix.
    pub async fn list(&self) -> Result<Vec<ObjectMeta>, StoreError> {
        let prefix = (!self.key.as_ref().is_empty()).then_some(&self.key);
        self.retry("list", || async {
            match self.client.list_with_delimiter(prefix).await {
                Ok(listing) => Ok(listing.objects),
                // A prefix with nothing under it is an empty listing, not an error.
                Err(object_store::Error::NotFound { .. }) => Ok(Vec::new()),
                Err(e) => Err(self.classify("list", &e)),
            }
        })
        .await
    }

    /// One GET of the whole object, refused once its size is above `max` (its body is then
    /// never read).
    pub async fn get_small(&self, max: u64) -> Result<Bytes, StoreError> {
        self.retry("GET", || async {
            let res = match self.client.get_opts(&self.key, GetOptions::default()).await {
                Ok(res) => res,
                Err(e) => return Err(self.classify("GET", &e)),
            };
            if res.meta.size > max {
                return Err(Failure::Fatal(StoreError::TooLarge {
                    object: self.name.to_string(),
                    len: res.meta.size,
                    max,
                }));
            }
            let want = res.meta.size;
            let body = res
                .bytes()
                .await
                .map_err(|e| Failure::Transient(chain(&e)))?;
            if body.len() as u64 != want {
                return Err(Failure::Transient(format!(
                    "the server sent {} bytes of a {want}-byte object",
                    body.len()
                )));
            }
            Ok(body)
        })
        .await
    }

    /// DELETE; an object that is not there is no error.
    pub async fn delete(&self) -> Result<(), StoreError> {
        let res = self
            .retry("DELETE", || async {
                ObjectStoreExt::delete(&*self.client, &self.key)
                    .await
                    .map_err(|e| self.classify("DELETE", &e))
            })
            .await;
        match res {
            Err(StoreError::NotFound { .. }) => Ok(()),
            other => other,
        }
    }

    /// One PUT of the whole object (small uploads).
    pub async fn put(&self, payload: PutPayload) -> Result<(), StoreError> {
        self.retry("PUT", || async {
            ObjectStoreExt::put(&*self.client, &self.key, payload.clone())
                .await
                .map(drop)
                .map_err(|e| self.classify("PUT", &e))
        })
        .await
    }

    /// Starts a multipart upload; returns its id.
    pub async fn create_multipart(&self) -> Result<String, StoreError> {
        let op = "start of the multipart upload";
        self.retry(op, || async {
            self.client
                .create_multipart(&self.key)
                .await
                .map_err(|e| self.classify(op, &e))
        })
        .await
    }

    /// Uploads part `idx` (0-based); the same index may be sent again after a failure.
    pub async fn put_part(
        &self,
        id: &str,
        idx: usize,
        data: PutPayload,
    ) -> Result<PartId, StoreError> {
        let op = format!("upload of part {idx} ({} bytes)", data.content_length());
        let id = id.to_string();
        self.retry(&op, || async {
            self.client
                .put_part(&self.key, &id, idx, data.clone())
                .await
                .map_err(|e| self.classify(&op, &e))
        })
        .await
    }

    /// Completes a multipart upload: the object becomes visible.
    pub async fn complete(&self, id: &str, parts: Vec<PartId>) -> Result<(), StoreError> {
        let op = "completion of the multipart upload";
        let id = id.to_string();
        self.retry(op, || async {
            self.client
                .complete_multipart(&self.key, &id, parts.clone())
                .await
                .map(drop)
                .map_err(|e| self.classify(op, &e))
        })
        .await
    }

    /// Aborts a multipart upload, so that its parts are not kept (and billed).
    pub async fn abort(&self, id: &str) -> Result<(), StoreError> {
        let op = "abort of the multipart upload";
        let id = id.to_string();
        self.retry(op, || async {
            self.client
                .abort_multipart(&self.key, &id)
                .await
                .map_err(|e| self.classify(op, &e))
        })
        .await
    }
}

/// Whether a `Generic` object_store error is worth another try: a transport failure
/// (connection refused while a server restarts, reset, timeout, body cut) or a server-side
/// status (5xx, 429 slow down, 408) that object_store gave up on.
fn is_transient(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut source = Some(e);
    while let Some(s) = source {
        if s.downcast_ref::<object_store::client::HttpError>()
            .is_some()
        {
            return true;
        }
        source = s.source();
    }
    let text = chain(e);
    let retry_status = matches!(http_status(&text), Some(408 | 429 | 500..=599));
    // "error response": a 200 whose body is an S3 error (InternalError, SlowDown).
    retry_status || text.contains("Server returned error response")
}

/// The HTTP status in an object_store error's text ("... status code: 403 Forbidden ..."):
/// object_store does not expose it for every request kind.
fn http_status(text: &str) -> Option<u16> {
    let (_, rest) = text.split_once("status code: ")?;
    rest.get(..3)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn vars(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| map.get(k).cloned()
    }

    #[test]
    fn config_from_vars() {
        let c = S3Config::from_vars(vars(&[
            ("AWS_ACCESS_KEY_ID", "AKID"),
            ("AWS_SECRET_ACCESS_KEY", "SECRET-sentinel-123"),
            ("AWS_SESSION_TOKEN", "TOKEN-sentinel-456"),
            ("AWS_ENDPOINT", "http://127.0.0.1:8333"),
            ("AWS_ALLOW_HTTP", "TRUE"),
        ]))
        .unwrap();
        assert_eq!(c.region, DEFAULT_REGION);
        assert_eq!(c.endpoint.as_deref(), Some("http://127.0.0.1:8333"));
        assert!(c.allow_http);
        let shown = format!("{c:?} {c:#?}");
        assert!(!shown.contains("SECRET-sentinel-123"), "{shown}");
        assert!(!shown.contains("TOKEN-sentinel-456"), "{shown}");
        c.client("bucket", &StoreOptions::default()).unwrap();
    }

    #[test]
    fn statuses_are_found_in_messages() {
        let text = "Error performing GET http://h/b in 1ms - Server returned non-2xx status code: 403 Forbidden: <Error>";
        assert_eq!(http_status(text), Some(403));
        assert_eq!(http_status("status code: 5"), None);
        assert_eq!(http_status("no status"), None);
    }

    #[test]
    fn config_errors() {
        let e = S3Config::from_vars(vars(&[("AWS_ACCESS_KEY_ID", "AKID")])).unwrap_err();
        assert!(
            e.to_string().contains("AWS_SECRET_ACCESS_KEY is not"),
            "{e}"
        );
        let e = S3Config::from_vars(vars(&[("AWS_ALLOW_HTTP", "yes")])).unwrap_err();
        assert!(e.to_string().contains("AWS_ALLOW_HTTP"), "{e}");
        let c = S3Config::from_vars(vars(&[("AWS_ENDPOINT_URL", "http://h:1")])).unwrap();
        let e = c.client("b", &StoreOptions::default()).unwrap_err();
        assert!(e.to_string().contains("AWS_ALLOW_HTTP=true"), "{e}");
        let c = S3Config::from_vars(vars(&[("AWS_ENDPOINT_URL", "ftp://h")])).unwrap();
        assert!(c.client("b", &StoreOptions::default()).is_err());
        let c = S3Config::from_vars(vars(&[("AWS_REGION", "eu-west-3")])).unwrap();
        assert_eq!(c.region, "eu-west-3");
    }
}
