//! Command-line values that clap checks as it parses them.

/// A count of one or more.
pub fn count(text: &str) -> std::result::Result<usize, String> {
    match text.parse::<usize>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(format!("{e} (give a whole number of at least 1)")),
    }
}

/// A torch thread count, at most 4096 (torch takes an i32; more is a typo).
pub fn thread_count(text: &str) -> std::result::Result<usize, String> {
    const MOST: usize = 4096;
    match count(text)? {
        n if n > MOST => Err(format!("at most {MOST}")),
        n => Ok(n),
    }
}
