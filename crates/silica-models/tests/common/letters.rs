//! The words of the synthetic vocabularies of the tiny test models.

/// The `n`-th string of the bijective base-26 numbering: a..z, aa..zz, ...
pub fn letters(mut n: usize) -> String {
    let mut s = Vec::new();
    loop {
        s.push(b'a' + (n % 26) as u8);
        if n < 26 {
            break;
        }
        n = n / 26 - 1;
    }
    s.reverse();
    String::from_utf8(s).expect("ASCII letters")
}
