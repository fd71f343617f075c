//! The fuzz binaries load the same libllama dflash2 links: an rpath to the
//! prefix dflash2's build script exported (links = "llama").
fn main() {
    if let Ok(prefix) = std::env::var("DEP_LLAMA_PREFIX") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{prefix}/lib");
    }
}
