//! Registries for the pull tests: the real CNCF distribution registry (`docker-registry`)
//! on a free local port, images built and pushed to it over plain HTTP, and small fake
//! registries that lie, cut downloads short or never answer.

#![allow(dead_code)]

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use airlock_image::Digest;
use base64::Engine as _;

pub const REGISTRY_BIN: &str = "/usr/bin/docker-registry";

pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub const OCI_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
pub const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
pub const DOCKER_CONFIG: &str = "application/vnd.docker.container.image.v1+json";
pub const TAR: &str = "application/vnd.oci.image.layer.v1.tar";
pub const TAR_GZIP: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
pub const TAR_ZSTD: &str = "application/vnd.oci.image.layer.v1.tar+zstd";
pub const DOCKER_GZIP: &str = "application/vnd.docker.image.rootfs.diff.tar.gzip";

/// Whether the real registry can be run; prints why a test is skipped when not.
pub fn registry_available() -> bool {
    let ok = Path::new(REGISTRY_BIN).exists();
    if !ok {
        eprintln!("skipped: {REGISTRY_BIN} is not installed (Debian package docker-registry)");
    }
    ok
}

/// A `docker-registry serve` process with its storage in a temporary directory; killed
/// on drop.
pub struct Registry {
    child: Child,
    /// `127.0.0.1:<port>`.
    pub host: String,
    /// Holds the config and the storage.
    pub dir: tempfile::TempDir,
    /// How pushes authenticate, when the registry wants it.
    push_auth: PushAuth,
}

enum PushAuth {
    None,
    /// An `Authorization: Basic …` value.
    Basic(String),
    /// Tokens minted for each push.
    Token(Arc<TokenSigner>),
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A port free now (bound then released).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl Registry {
    /// An open registry.
    pub fn start() -> Self {
        Self::start_with(tempfile::tempdir().unwrap(), String::new(), PushAuth::None)
    }

    /// A registry wanting basic auth for `user` / `password` (htpasswd, bcrypt).
    pub fn start_basic(user: &str, password: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let hash = bcrypt::hash(password, 4).unwrap();
        let htpasswd = dir.path().join("htpasswd");
        std::fs::write(&htpasswd, format!("{user}:{hash}\n")).unwrap();
        let auth = format!(
            "auth:\n  htpasswd:\n    realm: test-realm\n    path: {}\n",
            htpasswd.display()
        );
        Self::start_with(dir, auth, PushAuth::Basic(basic_header(user, password)))
    }

    /// A registry wanting bearer tokens (Docker Hub style), and the token server that
    /// issues them to `user` / `password`.
    pub fn start_token(user: &str, password: &str) -> (Self, TokenServer) {
        let dir = tempfile::tempdir().unwrap();
        let signer = Arc::new(TokenSigner::new(dir.path()));
        let server = TokenServer::start(signer.clone(), user, password);
        let auth = format!(
            "auth:\n  token:\n    realm: http://{}/token\n    service: {SERVICE}\n    issuer: {ISSUER}\n    rootcertbundle: {}\n",
            server.host,
            dir.path().join("cert.pem").display()
        );
        (Self::start_with(dir, auth, PushAuth::Token(signer)), server)
    }

    fn start_with(dir: tempfile::TempDir, auth: String, push_auth: PushAuth) -> Self {
        let port = free_port();
        let host = format!("127.0.0.1:{port}");
        let storage = dir.path().join("storage");
        let config = format!(
            "version: 0.1\nlog:\n  level: error\n  accesslog:\n    disabled: true\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: {host}\n{auth}",
            storage.display()
        );
        let config_path = dir.path().join("config.yml");
        std::fs::write(&config_path, config).unwrap();
        let log = std::fs::File::create(dir.path().join("registry.log")).unwrap();
        let child = Command::new(REGISTRY_BIN)
            .arg("serve")
            .arg(&config_path)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        let reg = Self {
            child,
            host,
            dir,
            push_auth,
        };
        let until = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(&reg.host).is_err() {
            assert!(Instant::now() < until, "registry did not start: {}", reg.log());
            std::thread::sleep(Duration::from_millis(20));
        }
        reg
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("registry.log")).unwrap_or_default()
    }

    /// Where the registry keeps a blob's bytes.
    pub fn blob_file(&self, digest: &Digest) -> PathBuf {
        self.dir.path().join(format!(
            "storage/docker/registry/v2/blobs/sha256/{}/{}/data",
            &digest.hex()[..2],
            digest.hex()
        ))
    }

    fn request(&self, method: &str, url: &str, repo: &str) -> ureq::Request {
        let r = ureq::request(method, url);
        match &self.push_auth {
            PushAuth::None => r,
            PushAuth::Basic(a) => r.set("Authorization", a),
            PushAuth::Token(signer) => r.set(
                "Authorization",
                &format!("Bearer {}", signer.token("pusher", repo, &["pull", "push"])),
            ),
        }
    }

    /// Uploads `bytes` monolithically (POST, then PUT with the digest); returns the digest.
    pub fn push_blob(&self, repo: &str, bytes: &[u8]) -> Digest {
        let digest = Digest::of(bytes);
        let start = self
            .request(
                "POST",
                &format!("http://{}/v2/{repo}/blobs/uploads/", self.host),
                repo,
            )
            .call()
            .unwrap();
        assert_eq!(start.status(), 202);
        let location = start.header("Location").unwrap().to_owned();
        let mut url = if location.starts_with("http") {
            location
        } else {
            format!("http://{}{location}", self.host)
        };
        url.push(if url.contains('?') { '&' } else { '?' });
        url.push_str(&format!("digest={digest}"));
        let done = self
            .request("PUT", &url, repo)
            .set("Content-Type", "application/octet-stream")
            .send_bytes(bytes)
            .unwrap();
        assert_eq!(done.status(), 201);
        digest
    }

    /// Puts a manifest under `reference` (a tag or a digest); returns its digest.
    pub fn push_manifest(&self, repo: &str, reference: &str, media_type: &str, bytes: &[u8]) -> Digest {
        let r = self
            .request(
                "PUT",
                &format!("http://{}/v2/{repo}/manifests/{reference}", self.host),
                repo,
            )
            .set("Content-Type", media_type)
            .send_bytes(bytes)
            .unwrap();
        assert_eq!(r.status(), 201);
        Digest::of(bytes)
    }

    /// Pushes the layers and config of `image`, then its manifest under `tag`.
    pub fn push_image(&self, repo: &str, tag: &str, image: &TestImage) -> Digest {
        for (bytes, _) in &image.layers {
            self.push_blob(repo, bytes);
        }
        self.push_blob(repo, &image.config);
        self.push_manifest(repo, tag, image.manifest_type, &image.manifest())
    }
}

pub fn basic_header(user: &str, password: &str) -> String {
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
    )
}

/// An image: layers (bytes and media type) and a config, and the manifest naming them.
pub struct TestImage {
    pub layers: Vec<(Vec<u8>, &'static str)>,
    pub config: Vec<u8>,
    pub manifest_type: &'static str,
    pub config_type: &'static str,
}

impl TestImage {
    /// An OCI image with these layers; `arch` goes into the config.
    pub fn oci(layers: Vec<(Vec<u8>, &'static str)>, arch: &str) -> Self {
        let config = format!(
            r#"{{"architecture":"{arch}","os":"linux","config":{{"Env":["PATH=/bin"]}},"rootfs":{{"type":"layers","diff_ids":[]}}}}"#
        )
        .into_bytes();
        Self {
            layers,
            config,
            manifest_type: OCI_MANIFEST,
            config_type: OCI_CONFIG,
        }
    }

    /// The same, as a Docker schema 2 image.
    pub fn docker(layers: Vec<(Vec<u8>, &'static str)>) -> Self {
        Self {
            manifest_type: DOCKER_MANIFEST,
            config_type: DOCKER_CONFIG,
            ..Self::oci(layers, "amd64")
        }
    }

    pub fn manifest(&self) -> Vec<u8> {
        let layers: Vec<String> = self.layers.iter().map(|(b, mt)| descriptor(mt, b)).collect();
        format!(
            r#"{{"schemaVersion":2,"mediaType":"{}","config":{},"layers":[{}]}}"#,
            self.manifest_type,
            descriptor(self.config_type, &self.config),
            layers.join(",")
        )
        .into_bytes()
    }

    pub fn manifest_digest(&self) -> Digest {
        Digest::of(&self.manifest())
    }

    pub fn layer_digests(&self) -> Vec<Digest> {
        self.layers.iter().map(|(b, _)| Digest::of(b)).collect()
    }

    pub fn config_digest(&self) -> Digest {
        Digest::of(&self.config)
    }
}

pub fn descriptor(media_type: &str, bytes: &[u8]) -> String {
    format!(
        r#"{{"mediaType":"{media_type}","digest":"{}","size":{}}}"#,
        Digest::of(bytes),
        bytes.len()
    )
}

/// An OCI index naming each manifest with its platform (`os/arch`).
pub fn index(entries: &[(&[u8], &str)]) -> Vec<u8> {
    let manifests: Vec<String> = entries
        .iter()
        .map(|(m, platform)| {
            let (os, arch) = platform.split_once('/').unwrap();
            format!(
                r#"{{"mediaType":"{OCI_MANIFEST}","digest":"{}","size":{},"platform":{{"os":"{os}","architecture":"{arch}"}}}}"#,
                Digest::of(m),
                m.len()
            )
        })
        .collect();
    format!(
        r#"{{"schemaVersion":2,"mediaType":"{OCI_INDEX}","manifests":[{}]}}"#,
        manifests.join(",")
    )
    .into_bytes()
}

/// What a fake registry answers for one path.
#[derive(Clone)]
pub struct Reply {
    pub status: u16,
    pub content_type: String,
    pub body: Vec<u8>,
    /// Sent as Content-Length (default: the body's length).
    pub declared_len: Option<usize>,
    /// Extra headers.
    pub headers: Vec<(String, String)>,
    /// Hold the connection open this long after the body, without closing it.
    pub stall: Option<Duration>,
}

impl Reply {
    pub fn ok(content_type: &str, body: Vec<u8>) -> Self {
        Self {
            status: 200,
            content_type: content_type.into(),
            body,
            declared_len: None,
            headers: Vec::new(),
            stall: None,
        }
    }
}

/// A registry of canned replies on 127.0.0.1 (one request per connection): `GET /v2/`
/// answers 200, listed paths their reply, anything else 404. Counts requests per path.
pub struct FakeRegistry {
    pub host: String,
    pub hits: Arc<Mutex<HashMap<String, usize>>>,
}

impl FakeRegistry {
    pub fn start(routes: HashMap<String, Reply>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let host = listener.local_addr().unwrap().to_string();
        let hits: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
        let h = hits.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { return };
                let routes = routes.clone();
                let h = h.clone();
                std::thread::spawn(move || serve_one(conn, &routes, &h));
            }
        });
        Self { host, hits }
    }

    pub fn hits(&self, path: &str) -> usize {
        self.hits.lock().unwrap().get(path).copied().unwrap_or(0)
    }
}

fn serve_one(mut conn: TcpStream, routes: &HashMap<String, Reply>, hits: &Mutex<HashMap<String, usize>>) {
    let mut reader = BufReader::new(conn.try_clone().unwrap());
    let mut line = String::new();
    if reader.read_line(&mut line).unwrap_or(0) == 0 {
        return;
    }
    let path = line.split_whitespace().nth(1).unwrap_or("").to_owned();
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h).unwrap_or(0) == 0 || h == "\r\n" {
            break;
        }
    }
    *hits.lock().unwrap().entry(path.clone()).or_default() += 1;
    let reply = if path == "/v2/" {
        Reply::ok("application/json", b"{}".to_vec())
    } else if let Some(r) = routes.get(&path) {
        r.clone()
    } else {
        Reply {
            status: 404,
            ..Reply::ok(
                "application/json",
                br#"{"errors":[{"code":"MANIFEST_UNKNOWN","message":"manifest unknown"}]}"#.to_vec(),
            )
        }
    };
    let mut head = format!(
        "HTTP/1.1 {} X\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n",
        reply.status,
        reply.content_type,
        reply.declared_len.unwrap_or(reply.body.len())
    );
    for (k, v) in &reply.headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    let _ = conn.write_all(head.as_bytes());
    let _ = conn.write_all(&reply.body);
    let _ = conn.flush();
    if let Some(stall) = reply.stall {
        std::thread::sleep(stall);
    }
    let _ = conn.shutdown(std::net::Shutdown::Both);
}

/// A listener that accepts connections and never answers; counts them.
pub struct SilentServer {
    pub host: String,
    pub accepted: Arc<AtomicUsize>,
}

impl SilentServer {
    pub fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let host = listener.local_addr().unwrap().to_string();
        let accepted = Arc::new(AtomicUsize::new(0));
        let a = accepted.clone();
        std::thread::spawn(move || {
            let mut held = Vec::new();
            for conn in listener.incoming() {
                let Ok(mut conn) = conn else { return };
                a.fetch_add(1, Ordering::SeqCst);
                // Drain what the client sends, so it never blocks on a full socket.
                let mut buf = [0u8; 4096];
                let _ = conn.set_read_timeout(Some(Duration::from_millis(50)));
                let _ = conn.read(&mut buf);
                held.push(conn);
            }
        });
        Self { host, accepted }
    }
}

/// The token service name and issuer the test registry trusts.
pub const SERVICE: &str = "airlock-test-registry";
pub const ISSUER: &str = "airlock-test-issuer";

/// Signs registry bearer tokens (RS256, the self-signed certificate in `x5c`) with a key
/// made by `openssl` in `dir` (`key.pem`, `cert.pem`).
pub struct TokenSigner {
    key: jsonwebtoken::EncodingKey,
    /// The certificate, DER, base64.
    x5c: String,
}

impl TokenSigner {
    fn new(dir: &Path) -> Self {
        let run = |args: &[&str]| {
            let out = Command::new("openssl")
                .args(args)
                .current_dir(dir)
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "openssl {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        run(&["genrsa", "-traditional", "-out", "key.pem", "2048"]);
        run(&[
            "req",
            "-new",
            "-x509",
            "-key",
            "key.pem",
            "-out",
            "cert.pem",
            "-days",
            "2",
            "-subj",
            "/CN=airlock-test-token",
        ]);
        run(&["x509", "-in", "cert.pem", "-outform", "DER", "-out", "cert.der"]);
        let key =
            jsonwebtoken::EncodingKey::from_rsa_pem(&std::fs::read(dir.join("key.pem")).unwrap()).unwrap();
        let x5c =
            base64::engine::general_purpose::STANDARD.encode(std::fs::read(dir.join("cert.der")).unwrap());
        Self { key, x5c }
    }

    /// A token for `sub` granting `actions` on `repo` (none when `actions` is empty).
    pub fn token(&self, sub: &str, repo: &str, actions: &[&str]) -> String {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        let access = if actions.is_empty() {
            serde_json::json!([])
        } else {
            serde_json::json!([{"type": "repository", "name": repo, "actions": actions}])
        };
        let claims = serde_json::json!({
            "iss": ISSUER, "sub": sub, "aud": SERVICE,
            "exp": now + 300, "nbf": now - 10, "iat": now,
            "jti": format!("{now}-{sub}-{repo}"),
            "access": access,
        });
        let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::RS256);
        header.x5c = Some(vec![self.x5c.clone()]);
        jsonwebtoken::encode(&header, &claims, &self.key).unwrap()
    }
}

/// The token endpoint (`GET /token?scope=repository:<name>:pull&service=…`): with the
/// right basic credentials, a token granting what the scope asks; with none, a token
/// granting nothing (as Docker Hub does for private repositories); with wrong ones, 401.
pub struct TokenServer {
    pub host: String,
    /// Tokens issued.
    pub issued: Arc<AtomicUsize>,
}

impl TokenServer {
    fn start(signer: Arc<TokenSigner>, user: &str, password: &str) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let host = listener.local_addr().unwrap().to_string();
        let issued = Arc::new(AtomicUsize::new(0));
        let expected = basic_header(user, password);
        let (count, user) = (issued.clone(), user.to_owned());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(mut conn) = conn else { return };
                let mut reader = BufReader::new(conn.try_clone().unwrap());
                let mut line = String::new();
                let _ = reader.read_line(&mut line);
                let target = line.split_whitespace().nth(1).unwrap_or("").to_owned();
                let mut auth = None;
                loop {
                    let mut h = String::new();
                    if reader.read_line(&mut h).unwrap_or(0) == 0 || h == "\r\n" {
                        break;
                    }
                    if let Some((k, v)) = h.split_once(':')
                        && k.eq_ignore_ascii_case("authorization")
                    {
                        auth = Some(v.trim().to_owned());
                    }
                }
                let scope = target
                    .split(['?', '&'])
                    .find_map(|kv| kv.strip_prefix("scope="))
                    .map(|s| s.replace("%3A", ":").replace("%2F", "/"))
                    .unwrap_or_default();
                let repo = scope.split(':').nth(1).unwrap_or("").to_owned();
                let (status, body) = match auth {
                    Some(a) if a == expected => {
                        count.fetch_add(1, Ordering::SeqCst);
                        (
                            200,
                            format!(r#"{{"token":"{}"}}"#, signer.token(&user, &repo, &["pull"])),
                        )
                    }
                    None => (
                        200,
                        format!(r#"{{"token":"{}"}}"#, signer.token("anonymous", &repo, &[])),
                    ),
                    Some(_) => (401, r#"{"details":"incorrect username or password"}"#.to_owned()),
                };
                let _ = write!(
                    conn,
                    "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
            }
        });
        Self { host, issued }
    }
}
