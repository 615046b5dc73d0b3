//! The audience-scoped ServiceAccount token a request carries. It is a bearer secret:
//! it has no `Display`, its `Debug` shows nothing of it, and [`SecurityToken::redact`]
//! takes it out of text that came back from the server before that text is shown.

use std::fmt;

/// A bearer token for the SnapshotMetadata service.
#[derive(Clone, PartialEq, Eq)]
pub struct SecurityToken(String);

impl SecurityToken {
    /// The token as given (a token file's content should be trimmed first).
    pub fn new(token: impl Into<String>) -> Self {
        Self(token.into())
    }

    pub(crate) fn expose(&self) -> &str {
        &self.0
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// `text` with every occurrence of the token replaced by `[redacted]`: a server's
    /// error message may echo what it was sent.
    pub fn redact(&self, text: &str) -> String {
        if self.0.is_empty() {
            text.to_string()
        } else {
            text.replace(&self.0, "[redacted]")
        }
    }
}

impl fmt::Debug for SecurityToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SecurityToken([redacted])")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_never_shows() {
        let token = SecurityToken::new("s3cr3t-token");
        assert_eq!(format!("{token:?}"), "SecurityToken([redacted])");
        assert_eq!(
            token.redact("bad token s3cr3t-token for audience x"),
            "bad token [redacted] for audience x"
        );
        assert_eq!(SecurityToken::new("").redact("text"), "text");
    }
}
