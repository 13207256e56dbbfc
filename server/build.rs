//! The migrations are compiled into the binary (`sqlx::migrate!`), but cargo does not see
//! that the crate reads them: without this, adding a migration rebuilt nothing.
fn main() {
    println!("cargo:rerun-if-changed=../migrations");
}
