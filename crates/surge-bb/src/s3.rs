//! The object store behind the buffer, through `object_store` (any
//! S3-compatible endpoint). Blocking wrappers over one shared tokio runtime,
//! because the rest of the tier (FUSE callbacks, node threads) is synchronous.
//!
//! Layout in the bucket (see docs/burst-buffer.md):
//! - `.surge/chunks/{ino}/{idx}/{ver}`: one immutable chunk version
//! - `.surge/manifests/{ino}/{gen}.json`: one immutable file version, written
//!   after all its chunks, for a file whose manifest does not ride on its
//!   export object (sparse files, which get none, and files of many chunks)
//! - `.surge/layout.json`: written before the first manifest of a bucket that
//!   had none: its export keys are UTF-8 paths ([`keys`]); its absence where
//!   manifests exist means an older surge wrote them percent-encoded
//! - `{path}`: the file's content as an ordinary object (the export view), for
//!   other S3 tools, keyed by its UTF-8 path ([`keys`]); surge itself reads it
//!   only when importing. Its user metadata `surge-manifest` (the header
//!   `x-amz-meta-surge-manifest`) is the manifest of that version when it fits
//!   ([`EMBEDDED_MANIFEST_MAX`]): one PUT for both
//! - `{path}/`: an empty marker object per directory (as s3fs and the AWS
//!   console write them), so empty directories exist for other tools and imports

use bytes::Bytes;
use futures::TryStreamExt;
use object_store::aws::AmazonS3Builder;
use object_store::path::Path;
use object_store::{Attribute, Attributes, ClientOptions, ObjectStore, PutMultipartOpts, PutOptions, PutPayload, RetryConfig, WriteMultipart};
use std::sync::{Arc, LazyLock};
use std::time::Duration;

pub mod keys;
mod markers;

pub use keys::{dir_marker_key, export_key};

pub const INTERNAL_PREFIX: &str = ".surge";
pub const LAYOUT_KEY: &str = ".surge/layout.json";
/// The user-metadata name of the manifest an export object carries.
pub const MANIFEST_METADATA: &str = "surge-manifest";
/// S3 keeps at most 2 KB of user metadata per object (names and values): a
/// manifest up to this size rides on the export object, a longer one is an
/// object of its own.
pub const EMBEDDED_MANIFEST_MAX: usize = 1536;

pub(crate) static RT: LazyLock<tokio::runtime::Runtime> = LazyLock::new(|| {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("bb-io")
        .enable_all()
        .build()
        .expect("cannot start the tokio runtime")
});

#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct S3Config {
    /// e.g. http://127.0.0.1:9000 (None: AWS itself).
    pub endpoint: Option<String>,
    pub bucket: String,
    pub region: String,
    pub access_key: Option<String>,
    pub secret_key: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum S3Error {
    #[error("S3 {op} of {key} failed: {msg}")]
    Request { op: &'static str, key: String, msg: String },
    #[error("S3 configuration: {0}")]
    Config(String),
}

#[derive(Clone)]
pub struct S3 {
    store: Arc<dyn ObjectStore>,
    markers: Arc<markers::Markers>,
    pub bucket: String,
    /// Requests and bytes so far (what S3 bills), shared by clones.
    pub counts: Arc<S3Counts>,
}

/// S3's billing units as this process used them: PUT-class requests (PUT,
/// multipart parts, LIST), GET-class requests, bytes up and down.
#[derive(Debug, Default)]
pub struct S3Counts {
    pub puts: std::sync::atomic::AtomicU64,
    pub gets: std::sync::atomic::AtomicU64,
    pub bytes_up: std::sync::atomic::AtomicU64,
    pub bytes_down: std::sync::atomic::AtomicU64,
}

impl S3Counts {
    fn put(&self, bytes: usize) {
        use std::sync::atomic::Ordering::Relaxed;
        self.puts.fetch_add(1, Relaxed);
        self.bytes_up.fetch_add(bytes as u64, Relaxed);
    }

    fn get(&self, bytes: usize) {
        use std::sync::atomic::Ordering::Relaxed;
        self.gets.fetch_add(1, Relaxed);
        self.bytes_down.fetch_add(bytes as u64, Relaxed);
    }

    /// (PUT-class requests, GET-class requests, bytes up, bytes down).
    pub fn snapshot(&self) -> (u64, u64, u64, u64) {
        use std::sync::atomic::Ordering::Relaxed;
        (self.puts.load(Relaxed), self.gets.load(Relaxed), self.bytes_up.load(Relaxed), self.bytes_down.load(Relaxed))
    }
}

pub fn obj_path(key: &str) -> Path {
    Path::parse(key).unwrap_or_else(|_| Path::from(key))
}

pub fn chunk_key(ino: u64, idx: u64, ver: u64) -> String {
    format!("{INTERNAL_PREFIX}/chunks/{ino}/{idx}/{ver}")
}

pub fn manifest_key(ino: u64, gen: u64) -> String {
    format!("{INTERNAL_PREFIX}/manifests/{ino}/{gen:020}.json")
}

/// One level of a bucket listed with `/` as delimiter.
#[derive(Debug, Default)]
pub struct Level {
    /// (key, size) of the objects at this level.
    pub objects: Vec<(String, u64)>,
    /// The keys of the prefixes below it (no trailing `/`).
    pub prefixes: Vec<String>,
}
/// How the export keys of a bucket were written, as import reads them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyLayout {
    /// By this surge: UTF-8 paths ([`keys::decode_name`]).
    Utf8,
    /// By an older surge (manifests but no layout object): percent-encoded
    /// names are decoded ([`keys::legacy_name`]), others taken as they are.
    Legacy,
    /// By other tools only: every key is the names it spells.
    Foreign,
}

impl KeyLayout {
    /// The file name a key segment stands for.
    pub fn name(self, segment: &str) -> String {
        match self {
            KeyLayout::Utf8 => keys::decode_name(segment),
            KeyLayout::Legacy => keys::legacy_name(segment).unwrap_or_else(|| keys::decode_name(segment)),
            KeyLayout::Foreign => segment.to_string(),
        }
    }
}

impl S3 {
    /// Which [`KeyLayout`] the bucket's export keys follow.
    pub fn key_layout(&self) -> Result<KeyLayout, S3Error> {
        if self.get(LAYOUT_KEY)?.is_some() {
            return Ok(KeyLayout::Utf8);
        }
        let manifests = self.list_level(Some(&format!("{INTERNAL_PREFIX}/manifests")))?;
        Ok(if manifests.objects.is_empty() && manifests.prefixes.is_empty() { KeyLayout::Foreign } else { KeyLayout::Legacy })
    }

    /// Before the first manifest this process writes: records a bucket that
    /// has no manifests yet as [`KeyLayout::Utf8`]. A bucket an older surge
    /// wrote stays without the record (its keys are decoded per segment).
    pub fn ensure_layout(&self) -> Result<(), S3Error> {
        if self.key_layout()? == KeyLayout::Foreign {
            let body = serde_json::json!({ "export_keys": "utf8", "dir_markers": true }).to_string();
            self.put(LAYOUT_KEY, Bytes::from(body))?;
        }
        Ok(())
    }

    pub fn connect(cfg: &S3Config) -> Result<S3, S3Error> {
        let mut b = AmazonS3Builder::from_env()
            .with_bucket_name(&cfg.bucket)
            .with_region(&cfg.region)
            .with_retry(RetryConfig { max_retries: 3, retry_timeout: Duration::from_secs(10), ..Default::default() })
            .with_client_options(
                ClientOptions::new().with_connect_timeout(Duration::from_secs(2)).with_timeout(Duration::from_secs(60)),
            );
        if let Some(e) = &cfg.endpoint {
            b = b.with_endpoint(e).with_allow_http(true).with_virtual_hosted_style_request(false);
        }
        if let (Some(a), Some(s)) = (&cfg.access_key, &cfg.secret_key) {
            b = b.with_access_key_id(a).with_secret_access_key(s);
        }
        let store = b.build().map_err(|e| S3Error::Config(e.to_string()))?;
        let endpoint = cfg.endpoint.clone().unwrap_or_else(|| format!("https://s3.{}.amazonaws.com", cfg.region));
        let bucket_url = format!("{}/{}", endpoint.trim_end_matches('/'), cfg.bucket);
        let markers = markers::Markers::new(bucket_url, cfg.region.clone(), store.credentials().clone()).map_err(S3Error::Config)?;
        Ok(S3 { store: Arc::new(store), markers: Arc::new(markers), bucket: cfg.bucket.clone(), counts: Arc::default() })
    }

    fn err(op: &'static str, key: &str, e: impl std::fmt::Display) -> S3Error {
        S3Error::Request { op, key: key.to_string(), msg: e.to_string() }
    }

    pub fn put(&self, key: &str, data: Bytes) -> Result<(), S3Error> {
        self.put_with(key, data, Attributes::new())
    }

    fn put_with(&self, key: &str, data: Bytes, attributes: Attributes) -> Result<(), S3Error> {
        self.counts.put(data.len());
        let opts = PutOptions { attributes, ..Default::default() };
        RT.block_on(self.store.put_opts(&obj_path(key), PutPayload::from_bytes(data), opts)).map_err(|e| Self::err("PUT", key, e))?;
        Ok(())
    }

    /// The user metadata `name` of object `key` (a HEAD); `Ok(None)` when the
    /// object or the metadata does not exist.
    pub fn metadata(&self, key: &str, name: &str) -> Result<Option<String>, S3Error> {
        let opts = object_store::GetOptions { head: true, ..Default::default() };
        let r = RT.block_on(async {
            match self.store.get_opts(&obj_path(key), opts).await {
                Ok(g) => Ok(g.attributes.get(&Attribute::Metadata(name.to_string().into())).map(|v| v.as_ref().to_string())),
                Err(object_store::Error::NotFound { .. }) => Ok(None),
                Err(e) => Err(e),
            }
        });
        self.counts.get(0);
        r.map_err(|e| Self::err("HEAD", key, e))
    }

    /// `Ok(None)` when the object does not exist.
    pub fn get(&self, key: &str) -> Result<Option<Bytes>, S3Error> {
        let r = RT.block_on(async {
            match self.store.get(&obj_path(key)).await {
                Ok(g) => g.bytes().await.map(|b| {
                    self.counts.get(b.len());
                    Some(b)
                }),
                Err(object_store::Error::NotFound { .. }) => Ok(None),
                Err(e) => Err(e),
            }
        });
        r.map_err(|e| Self::err("GET", key, e))
    }

    pub fn get_range(&self, key: &str, range: std::ops::Range<u64>) -> Result<Bytes, S3Error> {
        if range.is_empty() {
            return Ok(Bytes::new());
        }
        self.counts.get((range.end - range.start) as usize);
        RT.block_on(self.store.get_range(&obj_path(key), range.start as usize..range.end as usize))
            .map_err(|e| Self::err("GET range", key, e))
    }

    /// Deletes `key`, a directory marker (`dir/`) included.
    pub fn delete(&self, key: &str) -> Result<(), S3Error> {
        if key.ends_with('/') {
            self.counts.put(0);
            return RT.block_on(self.markers.delete(key)).map_err(|e| Self::err("DELETE", key, e));
        }
        match RT.block_on(self.store.delete(&obj_path(key))) {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(Self::err("DELETE", key, e)),
        }
    }

    /// Uploads many objects with up to `parallel` in flight; one result each.
    pub fn put_many(&self, objs: Vec<(String, Bytes)>, parallel: usize) -> Vec<Result<(), S3Error>> {
        use futures::StreamExt;
        RT.block_on(async {
            futures::stream::iter(objs)
                .map(|(key, data)| async move {
                    self.counts.put(data.len());
                    self.store.put(&obj_path(&key), PutPayload::from_bytes(data)).await.map(|_| ()).map_err(|e| Self::err("PUT", &key, e))
                })
                .buffered(parallel.max(1))
                .collect()
                .await
        })
    }

    /// Writes the empty marker object `key` of a directory (`dir/`).
    pub fn put_dir_marker(&self, key: &str) -> Result<(), S3Error> {
        debug_assert!(key.ends_with('/'));
        self.counts.put(0);
        RT.block_on(self.markers.put(key)).map_err(|e| Self::err("PUT", key, e))
    }

    /// The objects and prefixes directly below `prefix` (the whole bucket's
    /// top level for `None`). A marker `prefix/` is listed as an object at
    /// `prefix` itself (object_store drops its trailing `/`).
    pub fn list_level(&self, prefix: Option<&str>) -> Result<Level, S3Error> {
        let p = prefix.map(obj_path);
        self.counts.put(0);
        let r = RT.block_on(self.store.list_with_delimiter(p.as_ref())).map_err(|e| Self::err("LIST", prefix.unwrap_or(""), e))?;
        Ok(Level {
            objects: r.objects.into_iter().map(|m| (m.location.as_ref().to_string(), m.size as u64)).collect(),
            prefixes: r.common_prefixes.into_iter().map(|p| p.as_ref().to_string()).collect(),
        })
    }

    /// Every (key, size) under `prefix`.
    pub fn list(&self, prefix: Option<&str>) -> Result<Vec<(String, u64)>, S3Error> {
        let p = prefix.map(obj_path);
        self.counts.put(0);
        RT.block_on(async { self.store.list(p.as_ref()).map_ok(|m| (m.location.as_ref().to_string(), m.size as u64)).try_collect().await })
            .map_err(|e| Self::err("LIST", prefix.unwrap_or(""), e))
    }

    /// Writes one object from a sequence of pieces produced on demand (a
    /// multipart upload for big objects), so a large file never sits in memory
    /// whole; `metadata` is its user metadata (name, value: visible ASCII).
    pub fn put_streamed(
        &self,
        key: &str,
        metadata: &[(&str, &str)],
        mut next: impl FnMut() -> Result<Option<Bytes>, S3Error>,
    ) -> Result<(), S3Error> {
        let path = obj_path(key);
        let attributes: Attributes =
            metadata.iter().map(|(k, v)| (Attribute::Metadata(k.to_string().into()), object_store::AttributeValue::from(v.to_string()))).collect();
        let first = next()?;
        let Some(first) = first else { return self.put_with(key, Bytes::new(), attributes) };
        let second = next()?;
        let Some(second) = second else { return self.put_with(key, first, attributes) };
        // Pieces are produced outside the runtime (producing one may itself do
        // blocking S3 reads); each is handed to the upload inside it.
        let opts = PutMultipartOpts { attributes, ..Default::default() };
        let mut w = RT
            .block_on(self.store.put_multipart_opts(&path, opts))
            .map(|u| WriteMultipart::new_with_chunk_size(u, 8 << 20))
            .map_err(|e| Self::err("multipart PUT", key, e))?;
        self.counts.put(0); // initiate; each 8 MiB part and the completion are counted below
        let mut part_fill = 0usize;
        let mut piece = Some(first);
        let mut pending = Some(second);
        loop {
            if let Some(p) = piece.take() {
                RT.block_on(async {
                    w.wait_for_capacity(4).await?;
                    w.write(&p);
                    part_fill += p.len();
                    while part_fill >= 8 << 20 {
                        part_fill -= 8 << 20;
                        self.counts.put(8 << 20);
                    }
                    Ok::<_, object_store::Error>(())
                })
                .map_err(|e| Self::err("multipart PUT", key, e))?;
            }
            piece = match pending.take() {
                Some(p) => Some(p),
                None => match next() {
                    Ok(p) => p,
                    Err(e) => {
                        let _ = RT.block_on(w.abort());
                        return Err(e);
                    }
                },
            };
            if piece.is_none() {
                break;
            }
        }
        RT.block_on(w.finish()).map_err(|e| Self::err("multipart PUT", key, e))?;
        self.counts.put(part_fill); // the last part
        self.counts.put(0); // completion
        Ok(())
    }
}
