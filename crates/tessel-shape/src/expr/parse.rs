//! The text form of expressions read back: [`Expr::parse`].

use super::{Expr, Var};

impl Expr {
    /// The expression whose text form (`Display`) is `text`, its variables named through
    /// `var`; `None` where the text is not one (or names an unknown variable, or divides by
    /// a constant zero). Equal to the printed expression wherever the same operations
    /// rebuild it, as they do for every form the printer writes; a caller that relies on it
    /// compares the result with the original.
    ///
    /// ```
    /// use tessel_shape::{Expr, Var};
    /// let n = Var::new("n", 1, 4096).unwrap();
    /// let e = (Expr::from(n) + 63) / 64 * 2 - 1;
    /// let back = Expr::parse(&e.to_string(), |name| (name == "n").then_some(n));
    /// assert_eq!(back, Some(e));
    /// ```
    pub fn parse(text: &str, var: impl Fn(&str) -> Option<Var>) -> Option<Expr> {
        let mut p = Parser {
            text: text.as_bytes(),
            at: 0,
            var: &var,
        };
        let e = p.comparison()?;
        p.skip_spaces();
        (p.at == p.text.len()).then_some(e)
    }
}

struct Parser<'a> {
    text: &'a [u8],
    at: usize,
    var: &'a dyn Fn(&str) -> Option<Var>,
}

impl Parser<'_> {
    fn skip_spaces(&mut self) {
        while self.text.get(self.at) == Some(&b' ') {
            self.at += 1;
        }
    }

    /// Consumes `token` (after spaces) if it comes next.
    fn eat(&mut self, token: &str) -> bool {
        self.skip_spaces();
        let found = self.text[self.at..].starts_with(token.as_bytes());
        if found {
            self.at += token.len();
        }
        found
    }

    /// `sum (< | ==) sum`, or a sum.
    fn comparison(&mut self) -> Option<Expr> {
        let a = self.sum()?;
        if self.eat("==") {
            return Some(a.cmp_eq(self.sum()?));
        }
        if self.eat("<") {
            return Some(a.cmp_lt(self.sum()?));
        }
        Some(a)
    }

    /// Terms joined by `+` and `-`, the first possibly negated.
    fn sum(&mut self) -> Option<Expr> {
        let mut e = if self.eat("-") {
            -self.product()?
        } else {
            self.product()?
        };
        loop {
            if self.eat("+") {
                e += self.product()?;
            } else if self.eat("-") {
                e -= self.product()?;
            } else {
                return Some(e);
            }
        }
    }

    /// Factors joined by `*`, `/` and `%`, left to right.
    fn product(&mut self) -> Option<Expr> {
        let mut e = self.atom()?;
        loop {
            if self.eat("*") {
                e *= self.atom()?;
            } else if self.eat("/") {
                e = e.checked_div(self.atom()?)?;
            } else if self.eat("%") {
                e = e.checked_rem(self.atom()?)?;
            } else {
                return Some(e);
            }
        }
    }

    /// A constant, a variable, `min(a, b)`, `max(a, b)` or a parenthesized expression.
    fn atom(&mut self) -> Option<Expr> {
        if self.eat("(") {
            let e = self.comparison()?;
            return self.eat(")").then_some(e);
        }
        let min: fn(Expr, Expr) -> Expr = |a, b| a.min(b);
        let max: fn(Expr, Expr) -> Expr = |a, b| a.max(b);
        for (name, f) in [("min(", min), ("max(", max)] {
            if self.eat(name) {
                let a = self.comparison()?;
                if !self.eat(",") {
                    return None;
                }
                let b = self.comparison()?;
                return self.eat(")").then(|| f(a, b));
            }
        }
        self.skip_spaces();
        let start = self.at;
        if self.text.get(self.at) == Some(&b'-') {
            self.at += 1;
        }
        while self.text.get(self.at).is_some_and(u8::is_ascii_digit) {
            self.at += 1;
        }
        let digits = std::str::from_utf8(&self.text[start..self.at]).ok()?;
        if !digits.is_empty() && digits != "-" {
            return digits.parse().ok().map(Expr::constant);
        }
        self.at = start;
        while self
            .text
            .get(self.at)
            .is_some_and(|c| c.is_ascii_alphanumeric() || *c == b'_')
        {
            self.at += 1;
        }
        let name = std::str::from_utf8(&self.text[start..self.at]).ok()?;
        if name.is_empty() {
            return None;
        }
        (self.var)(name).map(Expr::from)
    }
}

#[cfg(test)]
mod tests {
    use super::{Expr, Var};

    #[test]
    fn printed_expressions_read_back() {
        let n = Var::new("n", 1, 4096).unwrap();
        let b = Var::new("batch_2", 0, 64).unwrap();
        let (x, y) = (Expr::from(n), Expr::from(b));
        let lookup = |name: &str| match name {
            "n" => Some(n),
            "batch_2" => Some(b),
            _ => None,
        };
        let cases = [
            x,
            Expr::constant(-7),
            x * 3 + y - 2,
            -(x * 2) + 5,
            (x + 63) / 64,
            (x / 4) * 3,
            -(x % 4) + y,
            x * y * 12,
            x.min(y * 2 + 1).max(Expr::constant(3)),
            x.cmp_lt(y + 1),
            (x * y).cmp_eq(Expr::constant(8)),
            (x - 1) % (y + 2) * (x + y),
            x * (-3),
        ];
        for e in cases {
            let text = e.to_string();
            assert_eq!(Expr::parse(&text, lookup), Some(e), "{text}");
        }
        assert_eq!(Expr::parse("m + 1", lookup), None, "unknown variable");
        assert_eq!(Expr::parse("n +", lookup), None);
        assert_eq!(Expr::parse("n / 0", lookup), None);
        assert_eq!(Expr::parse("(n", lookup), None);
    }
}
