//! A TLS listener in front of a host's admin API, as an operator puts one:
//! a private CA, a certificate for `localhost` signed by it, and a proxy
//! that ends TLS and passes the bytes on. Loopback only; the accept loop
//! ends with the test's runtime.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::ServerConfig;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

pub struct TlsFront {
    /// `https://localhost:PORT`
    pub url: String,
    /// The CA's certificate, PEM: what `--ca-cert` takes.
    pub ca_pem: PathBuf,
}

/// Starts the proxy to `upstream` (`127.0.0.1:PORT`) and writes the CA to `dir`.
pub async fn front(upstream: &str, dir: &Path) -> TlsFront {
    let ca_key = rcgen::KeyPair::generate().expect("CA key");
    let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).expect("CA params");
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(rcgen::DnType::CommonName, "inboxd test CA");
    let ca_cert = ca.self_signed(&ca_key).expect("CA certificate");
    let key = rcgen::KeyPair::generate().expect("server key");
    let leaf = rcgen::CertificateParams::new(vec!["localhost".to_owned()])
        .expect("server params")
        .signed_by(&key, &ca_cert, &ca_key)
        .expect("server certificate");
    let ca_pem = dir.join("ca.pem");
    std::fs::write(&ca_pem, ca_cert.pem()).expect("write the CA");

    let config = ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(
            vec![CertificateDer::from(leaf.der().to_vec())],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
        )
        .expect("TLS server config");
    let acceptor = TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind the TLS front");
    let port = listener.local_addr().expect("local addr").port();
    let upstream: SocketAddr = upstream.parse().expect("upstream address");
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(client).await else {
                    return; // a client that refused our certificate
                };
                if let Ok(mut plain) = TcpStream::connect(upstream).await {
                    let _ = tokio::io::copy_bidirectional(&mut tls, &mut plain).await;
                }
            });
        }
    });
    TlsFront {
        url: format!("https://localhost:{port}"),
        ca_pem,
    }
}
