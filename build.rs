//! With the `mpi` feature: compiles `src/comm/mpi_in_place.c`, which hands Rust the MPI
//! library's `MPI_IN_PLACE` (rsmpi binds no in-place collectives), against the MPI that
//! rsmpi's own build finds. Nothing to do otherwise.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    #[cfg(feature = "mpi")]
    mpi_in_place();
}

#[cfg(feature = "mpi")]
fn mpi_in_place() {
    const SOURCE: &str = "src/comm/mpi_in_place.c";
    println!("cargo:rerun-if-changed={SOURCE}");
    // The `mpi` dependency is native only: a wasm32 build has no MPI to compile against.
    if std::env::var("CARGO_CFG_TARGET_ARCH").as_deref() == Ok("wasm32") {
        return;
    }
    let library = match build_probe_mpi::probe() {
        Ok(library) => library,
        Err(errors) => {
            for error in errors {
                println!("cargo:warning=looking for MPI: {error}");
            }
            panic!("the mpi feature needs an MPI library (Debian: openmpi-bin libopenmpi-dev)");
        }
    };
    let mut build = cc::Build::new();
    build.file(SOURCE);
    match library.mpicc {
        Some(mpicc) => {
            build.compiler(mpicc);
        }
        None => {
            for dir in &library.include_paths {
                build.include(dir);
            }
        }
    }
    build.compile("distopt_mpi_in_place");
}
