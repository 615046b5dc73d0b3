//! The client side of the service's bearer-token authentication: every call carries
//! `authorization: Bearer <token>`. The job service checks it (ferry-server's security
//! module); `ferry job`, `ferry schedule`, `ferry backup --server` and the operator's
//! link to its movers send it.

use ferry_core::{Error, Result, Secret};
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::Interceptor;
use tonic::{Request, Status};

/// Adds `authorization: Bearer <token>` to every call (nothing when there is no token).
#[derive(Clone)]
pub struct BearerToken {
    value: Option<MetadataValue<Ascii>>,
}

impl std::fmt::Debug for BearerToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BearerToken")
            .field("value", &self.value.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

impl BearerToken {
    /// The interceptor for `token`; a token that cannot be a header value is refused.
    pub fn new(token: Option<&Secret>) -> Result<Self> {
        let value =
            match token {
                None => None,
                Some(t) => Some(format!("Bearer {}", t.expose()).parse().map_err(|_| {
                    Error::invalid_input("the bearer token has invalid characters")
                })?),
            };
        Ok(Self { value })
    }
}

impl Interceptor for BearerToken {
    fn call(&mut self, mut request: Request<()>) -> std::result::Result<Request<()>, Status> {
        if let Some(v) = &self.value {
            request.metadata_mut().insert("authorization", v.clone());
        }
        Ok(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_header_is_sent_and_never_printed() {
        let mut auth = BearerToken::new(Some(&Secret::new("s3cr3t"))).unwrap();
        let request = auth.call(Request::new(())).unwrap();
        assert_eq!(
            request.metadata().get("authorization").unwrap(),
            "Bearer s3cr3t"
        );
        assert!(!format!("{auth:?}").contains("s3cr3t"));
        let mut none = BearerToken::new(None).unwrap();
        assert!(none
            .call(Request::new(()))
            .unwrap()
            .metadata()
            .get("authorization")
            .is_none());
        assert!(BearerToken::new(Some(&Secret::new("a\nb"))).is_err());
    }
}
