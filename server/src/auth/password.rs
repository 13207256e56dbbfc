//! Password hashing with argon2id (RFC 9106 second recommended parameters, the `argon2`
//! crate's defaults: 19 MiB, 2 passes), in PHC string format so parameters can be raised
//! later without invalidating stored hashes.

use argon2::{
    password_hash::{rand_core::OsRng, PasswordHash, PasswordHasher as _, PasswordVerifier as _, SaltString},
    Argon2,
};

/// Hashes a password for storage.
pub fn hash(password: &str) -> String {
    let salt = SaltString::generate(&mut OsRng);
    Argon2::default()
        .hash_password(password.as_bytes(), &salt)
        // Hashing fails only for parameters or salts outside argon2's limits; ours are the
        // crate defaults and a freshly generated salt.
        .expect("argon2 default parameters are valid")
        .to_string()
}

/// True when `password` matches `stored`. A malformed stored hash never matches.
pub fn verify(password: &str, stored: &str) -> bool {
    PasswordHash::new(stored)
        .is_ok_and(|parsed| Argon2::default().verify_password(password.as_bytes(), &parsed).is_ok())
}

/// Spends the same time as a real verification, so a login for an unknown user cannot be
/// told apart from a wrong password by its latency.
pub fn verify_dummy(password: &str) {
    static DUMMY: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    let stored = DUMMY.get_or_init(|| hash("fairway-dummy-password"));
    let _ = verify(password, stored);
}

/// A random password for the initial admin: 24 characters from a 62-letter alphabet
/// (about 143 bits).
pub fn generate() -> String {
    use rand::{distributions::Alphanumeric, Rng as _};
    rand::rngs::OsRng.sample_iter(&Alphanumeric).take(24).map(char::from).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hash_verifies_its_password_only() {
        let stored = hash("correct horse battery");
        assert!(stored.starts_with("$argon2id$"));
        assert!(verify("correct horse battery", &stored));
        assert!(!verify("correct horse batterx", &stored));
        assert!(!verify("anything", "not-a-hash"));
    }
}
