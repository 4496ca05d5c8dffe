//! Directory markers: empty objects whose key ends in `/`. object_store's
//! `Path` cannot name them (it strips a trailing `/`; apache/arrow-rs#7026,
//! arrow-rs-object-store#284), so their PUT and DELETE are signed here with
//! the AWS SDK's own SigV4 signer, with object_store's credentials, and sent
//! with reqwest (object_store's HTTP client).

use aws_credential_types::Credentials;
use aws_sigv4::http_request::{
    sign, PayloadChecksumKind, PercentEncodingMode, SignableBody, SignableRequest, SigningSettings,
    UriPathNormalizationMode,
};
use aws_sigv4::sign::v4;
use object_store::aws::AwsCredentialProvider;
use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use reqwest::Method;
use std::time::{Duration, SystemTime};

/// What a key's bytes become in a request path: everything but S3's
/// unreserved characters and `/` (as the AWS SDKs encode keys).
const KEY_IN_URL: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'.').remove(b'_').remove(b'~').remove(b'/');

pub(crate) struct Markers {
    http: reqwest::Client,
    /// `{endpoint}/{bucket}` (path-style, as object_store is configured).
    bucket_url: String,
    region: String,
    creds: AwsCredentialProvider,
}

impl Markers {
    pub(crate) fn new(bucket_url: String, region: String, creds: AwsCredentialProvider) -> Result<Markers, String> {
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(2))
            .timeout(Duration::from_secs(60))
            .build()
            .map_err(|e| e.to_string())?;
        Ok(Markers { http, bucket_url, region, creds })
    }

    /// Creates the empty object `key` (ending in `/`).
    pub(crate) async fn put(&self, key: &str) -> Result<(), String> {
        self.retried(Method::PUT, key).await
    }

    /// Deletes the object `key`; one that is not there is no error (S3's DELETE).
    pub(crate) async fn delete(&self, key: &str) -> Result<(), String> {
        self.retried(Method::DELETE, key).await
    }

    async fn retried(&self, method: Method, key: &str) -> Result<(), String> {
        let mut pause = Duration::from_millis(100);
        let mut attempt = 0;
        loop {
            match self.send(method.clone(), key).await {
                Ok(()) => return Ok(()),
                Err((e, retryable)) if retryable && attempt < 3 => {
                    tracing::debug!("{method} {key}: {e}; retrying");
                    tokio::time::sleep(pause).await;
                    pause *= 2;
                    attempt += 1;
                }
                Err((e, _)) => return Err(e),
            }
        }
    }

    /// One signed request; the error says whether another try may succeed.
    async fn send(&self, method: Method, key: &str) -> Result<(), (String, bool)> {
        let url = format!("{}/{}", self.bucket_url, utf8_percent_encode(key, KEY_IN_URL));
        let c = self.creds.get_credential().await.map_err(|e| (format!("credentials: {e}"), true))?;
        let identity = Credentials::new(&c.key_id, &c.secret_key, c.token.clone(), None, "object_store").into();
        let mut settings = SigningSettings::default();
        // S3 signs the path as sent (already encoded once) and never normalizes it.
        settings.percent_encoding_mode = PercentEncodingMode::Single;
        settings.uri_path_normalization_mode = UriPathNormalizationMode::Disabled;
        settings.payload_checksum_kind = PayloadChecksumKind::XAmzSha256;
        let params = v4::SigningParams::builder()
            .identity(&identity)
            .region(&self.region)
            .name("s3")
            .time(SystemTime::now())
            .settings(settings)
            .build()
            .map_err(|e| (e.to_string(), false))?
            .into();
        let signable = SignableRequest::new(method.as_str(), &url, std::iter::empty(), SignableBody::Bytes(&[]))
            .map_err(|e| (e.to_string(), false))?;
        let (signing, _) = sign(signable, &params).map_err(|e| (e.to_string(), false))?.into_parts();
        let deleting = method == Method::DELETE;
        let mut req = self.http.request(method, &url);
        for (name, value) in signing.headers() {
            req = req.header(name, value);
        }
        let resp = req.header(reqwest::header::CONTENT_LENGTH, "0").body(Vec::new()).send().await.map_err(|e| (e.to_string(), true))?;
        let status = resp.status();
        if status.is_success() || (deleting && status == reqwest::StatusCode::NOT_FOUND) {
            return Ok(());
        }
        let body = resp.text().await.unwrap_or_default();
        Err((format!("{status}: {}", body.chars().take(300).collect::<String>()), status.is_server_error() || status.as_u16() == 429))
    }
}
