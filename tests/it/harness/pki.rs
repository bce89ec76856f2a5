//! A private CA and leaves it signed, for the TLS tests.

/// A private CA and one leaf it signed (PEM).
pub(crate) struct Pki {
    pub(crate) ca_pem: String,
    pub(crate) leaf_pem: String,
    pub(crate) leaf_key_pem: String,
}

/// A fresh CA named `ca_name` and a leaf for `names` (IP literals become IP SANs).
pub(crate) fn pki(ca_name: &str, names: &[&str]) -> Pki {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, ca_name);
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let leaf_key = KeyPair::generate().unwrap();
    let mut leaf_params =
        CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap();
    leaf_params
        .distinguished_name
        .push(DnType::CommonName, names[0]);
    let leaf = leaf_params.signed_by(&leaf_key, &ca, &ca_key).unwrap();
    Pki {
        ca_pem: ca.pem(),
        leaf_pem: leaf.pem(),
        leaf_key_pem: leaf_key.serialize_pem(),
    }
}
