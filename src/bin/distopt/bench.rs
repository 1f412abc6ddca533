//! `distopt bench`: placeholder until the benchmark lands.
use distopt::Error;

pub fn run(_args: &[String]) -> Result<(), Error> {
    Err(Error::value("distopt bench: not built yet"))
}
