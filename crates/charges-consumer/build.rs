// refinery embeds migrations/ at compile time; without this a new migration file would
// not rebuild the crate, and a binary would ship the previous schema.
fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
