//! Keys the gateway issues: the format of their secrets, and how one is told from noise
//! without a call ([`secret`]).

pub(crate) mod secret;
