//! TLS to Postgres.
//!
//! `sslmode=require` in the database URL turns it on, and then the server is always
//! verified: its certificate must chain to `--database-ca-file` (or, without one, to
//! the system's roots) and name the host the URL connects to. That is libpq's
//! `verify-full`; tokio-postgres knows only `disable`, `prefer` and `require`, and an
//! encrypted connection to an unverified server protects a payments database from
//! nothing but passive listeners. `prefer` (the default) and `disable` stay in plain
//! text: a preference cannot be verified, so it is not offered.

use std::path::{Path, PathBuf};

use openssl::ssl::{SslConnector, SslMethod, SslVerifyMode};
use postgres_openssl::MakeTlsConnector;
use tokio_postgres::config::SslMode;

use crate::StoreError;

/// Which certificate authorities a server must chain to when TLS is required.
#[derive(Debug, Clone, Default)]
pub struct DatabaseTls {
    ca_file: Option<PathBuf>,
}

impl DatabaseTls {
    /// `None` trusts the system's roots.
    pub fn new(ca_file: Option<PathBuf>) -> Self {
        DatabaseTls { ca_file }
    }

    pub fn ca_file(&self) -> Option<&Path> {
        self.ca_file.as_deref()
    }

    /// Whether `config` asks for TLS at all.
    pub fn required_by(config: &tokio_postgres::Config) -> bool {
        config.get_ssl_mode() == SslMode::Require
    }

    /// A connector that verifies the chain and the host name.
    pub fn connector(&self) -> Result<MakeTlsConnector, StoreError> {
        let mut builder = SslConnector::builder(SslMethod::tls_client())?;
        if let Some(ca_file) = &self.ca_file {
            builder
                .set_ca_file(ca_file)
                .map_err(|e| StoreError::TlsCaFile(ca_file.clone(), e))?;
        }
        builder.set_verify(SslVerifyMode::PEER);
        Ok(MakeTlsConnector::new(builder.build()))
    }
}
