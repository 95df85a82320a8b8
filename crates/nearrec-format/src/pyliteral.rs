//! The header of a `.npy` file is a Python literal, such as
//! `{'descr': '<i8', 'fortran_order': False, 'shape': (3,), }`, which numpy reads with
//! `ast.literal_eval` and checks: a dict of exactly the keys `descr`, `fortran_order` (a bool)
//! and `shape` (a tuple of integers). This reads the literals such headers are made of (strings,
//! integers, `True` / `False` / `None`, tuples, lists, dicts) and makes the same checks.

const MAX_DEPTH: usize = 32;

#[derive(Debug, Clone, PartialEq)]
enum Lit {
    Str(String),
    Bool(bool),
    Int(i128),
    None,
    Tuple(Vec<Lit>),
    List(Vec<Lit>),
    Dict(Vec<(Lit, Lit)>),
}

struct Parser {
    chars: Vec<char>,
    at: usize,
}

impl Parser {
    fn peek(&mut self) -> Option<char> {
        while self.chars.get(self.at).is_some_and(|c| c.is_whitespace()) {
            self.at += 1;
        }
        self.chars.get(self.at).copied()
    }

    fn eat(&mut self, c: char) -> bool {
        let found = self.peek() == Some(c);
        self.at += usize::from(found);
        found
    }

    fn expect(&mut self, c: char) -> Result<(), String> {
        if self.eat(c) {
            Ok(())
        } else {
            Err(format!("expected {c:?} at character {}", self.at))
        }
    }

    fn value(&mut self, depth: usize) -> Result<Lit, String> {
        if depth > MAX_DEPTH {
            return Err("nested too deep".into());
        }
        match self.peek().ok_or("unexpected end")? {
            '{' => {
                self.at += 1;
                let mut items = Vec::new();
                while !self.eat('}') {
                    let key = self.value(depth + 1)?;
                    self.expect(':')?;
                    items.push((key, self.value(depth + 1)?));
                    if !self.eat(',') {
                        self.expect('}')?;
                        break;
                    }
                }
                Ok(Lit::Dict(items))
            }
            open @ ('(' | '[') => {
                self.at += 1;
                let close = if open == '(' { ')' } else { ']' };
                let (mut items, mut comma) = (Vec::new(), false);
                while !self.eat(close) {
                    items.push(self.value(depth + 1)?);
                    comma = self.eat(',');
                    if !comma {
                        self.expect(close)?;
                        break;
                    }
                }
                Ok(match (open, items.len(), comma) {
                    // `(x)` is x, not a tuple
                    ('(', 1, false) => items.pop().expect("one item"),
                    ('(', _, _) => Lit::Tuple(items),
                    _ => Lit::List(items),
                })
            }
            quote @ ('\'' | '"') => {
                self.at += 1;
                let mut s = String::new();
                loop {
                    match self.chars.get(self.at).copied() {
                        None => return Err("unterminated string".into()),
                        Some(c) if c == quote => break,
                        Some('\\') => {
                            let c = *self.chars.get(self.at + 1).ok_or("unterminated string")?;
                            s.push(match c {
                                'n' => '\n',
                                't' => '\t',
                                c => c,
                            });
                            self.at += 1;
                        }
                        Some(c) => s.push(c),
                    }
                    self.at += 1;
                }
                self.at += 1;
                Ok(Lit::Str(s))
            }
            c if c.is_ascii_digit() || c == '-' || c == '+' => {
                let start = self.at;
                self.at += 1;
                while self.chars.get(self.at).is_some_and(char::is_ascii_digit) {
                    self.at += 1;
                }
                let text: String = self.chars[start..self.at].iter().collect();
                // Python 2 long literals (`3L`), which numpy still reads in old headers
                if matches!(self.chars.get(self.at), Some('L' | 'l')) {
                    self.at += 1;
                }
                text.parse()
                    .map(Lit::Int)
                    .map_err(|_| format!("not an integer: {text}"))
            }
            c if c.is_ascii_alphabetic() => {
                let start = self.at;
                while self
                    .chars
                    .get(self.at)
                    .is_some_and(|c| c.is_ascii_alphanumeric())
                {
                    self.at += 1;
                }
                let word: String = self.chars[start..self.at].iter().collect();
                match word.as_str() {
                    "True" => Ok(Lit::Bool(true)),
                    "False" => Ok(Lit::Bool(false)),
                    "None" => Ok(Lit::None),
                    _ => Err(format!("not a literal: {word}")),
                }
            }
            c => Err(format!("unexpected {c:?} at character {}", self.at)),
        }
    }
}

/// A `.npy` header's `descr` (`None`: a structured dtype, a list of fields), `shape` and
/// `fortran_order`.
pub(crate) fn npy_header(text: &str) -> Result<(Option<String>, Vec<u64>, bool), String> {
    let mut p = Parser {
        chars: text.chars().collect(),
        at: 0,
    };
    let lit = p.value(0)?;
    if p.peek().is_some() {
        return Err(format!("trailing text at character {}", p.at));
    }
    let Lit::Dict(items) = lit else {
        return Err("not a dict".into());
    };
    // a dict literal's later duplicate keys win
    let get = |key: &str| {
        items
            .iter()
            .rev()
            .find(|(k, _)| *k == Lit::Str(key.into()))
            .map(|(_, v)| v)
    };
    let known = |k: &Lit| {
        ["descr", "fortran_order", "shape"]
            .iter()
            .any(|n| *k == Lit::Str((*n).into()))
    };
    if !items.iter().all(|(k, _)| known(k)) || get("descr").is_none() || get("shape").is_none() {
        return Err("the keys must be descr, fortran_order and shape".into());
    }
    let Some(&Lit::Bool(fortran)) = get("fortran_order") else {
        return Err("fortran_order is not a bool".into());
    };
    let shape = match get("shape") {
        Some(Lit::Tuple(dims)) => dims
            .iter()
            .map(|d| match d {
                Lit::Int(n) => u64::try_from(*n).map_err(|_| format!("shape has {n}")),
                _ => Err("shape is not a tuple of integers".into()),
            })
            .collect::<Result<Vec<u64>, String>>()?,
        _ => return Err("shape is not a tuple of integers".into()),
    };
    let descr = match get("descr") {
        Some(Lit::Str(s)) => Some(s.clone()),
        Some(Lit::List(_)) => None,
        _ => return Err("descr is not a type".into()),
    };
    Ok((descr, shape, fortran))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numpys_headers() {
        let h = "{'descr': '<i8', 'fortran_order': False, 'shape': (3,), }            \n";
        assert_eq!(npy_header(h), Ok((Some("<i8".into()), vec![3], false)));
        let h = "{\"shape\": (2, 5L), \"descr\": \">u4\", \"fortran_order\": True}";
        assert_eq!(npy_header(h), Ok((Some(">u4".into()), vec![2, 5], true)));
        let h = "{'descr': [('a', '<i4'), ('b', '<f8')], 'fortran_order': False, 'shape': ()}";
        assert_eq!(npy_header(h), Ok((None, vec![], false)));
    }

    #[test]
    fn what_numpy_refuses() {
        for h in [
            "",
            "{",
            "[1, 2]",
            "{'descr': '<i8', 'fortran_order': False}",
            "{'descr': '<i8', 'fortran_order': 0, 'shape': (3,)}",
            "{'descr': '<i8', 'fortran_order': False, 'shape': (3)}",
            "{'descr': '<i8', 'fortran_order': False, 'shape': [3]}",
            "{'descr': '<i8', 'fortran_order': False, 'shape': (-1,)}",
            "{'descr': '<i8', 'fortran_order': False, 'shape': (3,), 'x': 1}",
            "{'descr': 3, 'fortran_order': False, 'shape': (3,)}",
            "{'descr': '<i8', 'fortran_order': False, 'shape': (3,)} x",
            "{'descr': '<i8, 'fortran_order': False, 'shape': (3,)}",
            "{'descr': os.system('x'), 'fortran_order': False, 'shape': (3,)}",
        ] {
            assert!(npy_header(h).is_err(), "{h:?}");
        }
        let deep = "[".repeat(100) + &"]".repeat(100);
        assert_eq!(npy_header(&deep), Err("nested too deep".into()));
    }
}
