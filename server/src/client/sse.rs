//! A server-sent events parser (the WHATWG `text/event-stream` format), fed the body's chunks
//! as they arrive: a frame may be split anywhere, even inside a UTF-8 character, so lines are
//! cut on bytes and decoded whole.

/// One dispatched event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// The `event:` field; `message` when the frame named none, as the format says.
    pub event: String,
    /// The `data:` lines, joined with newlines.
    pub data: String,
    /// The `id:` field of this frame, when it had one.
    pub id: Option<String>,
}

/// Incremental parser: [`Parser::push`] each chunk, take the frames it completes.
#[derive(Debug, Default)]
pub struct Parser {
    /// Bytes of a line not yet ended.
    partial: Vec<u8>,
    /// A `\r` ended the last chunk: a `\n` opening the next one belongs to it.
    after_cr: bool,
    event: Option<String>,
    data: Option<String>,
    id: Option<String>,
    /// The last `id:` seen on any frame, which a reconnection sends back (`Last-Event-ID`).
    last_id: Option<String>,
}

impl Parser {
    /// Feeds a chunk and returns the frames it completed, in order.
    pub fn push(&mut self, chunk: &[u8]) -> Vec<Frame> {
        let mut frames = Vec::new();
        let mut rest = chunk;
        if self.after_cr && !rest.is_empty() {
            self.after_cr = false;
            if let Some(after) = rest.strip_prefix(b"\n") {
                rest = after;
            }
        }
        while let Some(end) = rest.iter().position(|b| *b == b'\n' || *b == b'\r') {
            self.partial.extend_from_slice(&rest[..end]);
            let line = std::mem::take(&mut self.partial);
            if rest[end] == b'\r' {
                match rest.get(end + 1) {
                    Some(b'\n') => rest = &rest[end + 2..],
                    Some(_) => rest = &rest[end + 1..],
                    None => {
                        self.after_cr = true;
                        rest = &[];
                    }
                }
            } else {
                rest = &rest[end + 1..];
            }
            if let Some(frame) = self.line(&String::from_utf8_lossy(&line)) {
                frames.push(frame);
            }
        }
        self.partial.extend_from_slice(rest);
        frames
    }

    /// The last event id the stream gave, to resume from.
    pub fn last_id(&self) -> Option<&str> {
        self.last_id.as_deref()
    }

    fn line(&mut self, line: &str) -> Option<Frame> {
        if line.is_empty() {
            let event = self.event.take();
            let id = self.id.take();
            // A frame without data is not dispatched (a bare `id:` only moves the cursor).
            let data = self.data.take()?;
            return Some(Frame { event: event.unwrap_or_else(|| "message".to_owned()), data, id });
        }
        if line.starts_with(':') {
            // A comment: the server's keepalive.
            return None;
        }
        let (field, value) = match line.split_once(':') {
            Some((field, value)) => (field, value.strip_prefix(' ').unwrap_or(value)),
            None => (line, ""),
        };
        match field {
            "event" => self.event = Some(value.to_owned()),
            "data" => match &mut self.data {
                Some(data) => {
                    data.push('\n');
                    data.push_str(value);
                }
                None => self.data = Some(value.to_owned()),
            },
            // An id with a NUL is ignored, as the format says.
            "id" if !value.contains('\0') => {
                self.id = Some(value.to_owned());
                self.last_id = Some(value.to_owned());
            }
            // `retry:` and unknown fields: this client paces its own reconnections.
            _ => {}
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(event: &str, data: &str, id: Option<&str>) -> Frame {
        Frame { event: event.to_owned(), data: data.to_owned(), id: id.map(str::to_owned) }
    }

    #[test]
    fn frames_end_at_a_blank_line_and_carry_their_fields() {
        let mut parser = Parser::default();
        let frames = parser.push(b"id: 7\nevent: job_event\ndata: {\"id\":7}\n\nevent: end\ndata: {}\n\n");
        assert_eq!(frames, vec![frame("job_event", "{\"id\":7}", Some("7")), frame("end", "{}", None)]);
        assert_eq!(parser.last_id(), Some("7"));
    }

    #[test]
    fn a_frame_split_anywhere_across_chunks_parses_the_same() {
        let text = "id: 12\r\nevent: job_event\r\ndata: {\"message\":\"café ☕\"}\r\n\r\n: keepalive\n\nevent: end\ndata: {}\n\n";
        let whole = Parser::default().push(text.as_bytes());
        for cut in 0..text.len() {
            let mut parser = Parser::default();
            let mut frames = parser.push(&text.as_bytes()[..cut]);
            frames.extend(parser.push(&text.as_bytes()[cut..]));
            assert_eq!(frames, whole, "cut at byte {cut}");
        }
        // Byte by byte, too.
        let mut parser = Parser::default();
        let frames: Vec<Frame> = text.as_bytes().iter().flat_map(|b| parser.push(&[*b])).collect();
        assert_eq!(frames, whole);
        assert_eq!(whole[0].data, "{\"message\":\"café ☕\"}");
    }

    #[test]
    fn comments_are_keepalives_and_dispatch_nothing() {
        let mut parser = Parser::default();
        assert!(parser.push(b": keepalive\n\n: keepalive\n\n").is_empty());
        assert_eq!(parser.last_id(), None);
    }

    #[test]
    fn data_lines_join_with_newlines_and_a_frame_without_data_is_not_dispatched() {
        let mut parser = Parser::default();
        let frames = parser.push(b"data: a\ndata:b\ndata\n\nid: 3\n\nevent: lonely\n\ndata: x\n\n");
        assert_eq!(frames, vec![frame("message", "a\nb\n", None), frame("message", "x", None)]);
        // The bare `id:` still moved the cursor, and `event: lonely` did not leak into `x`.
        assert_eq!(parser.last_id(), Some("3"));
    }

    #[test]
    fn a_lone_carriage_return_ends_a_line() {
        let mut parser = Parser::default();
        assert_eq!(parser.push(b"data: a\r\r"), vec![frame("message", "a", None)]);
    }

    #[test]
    fn an_unfinished_frame_is_held_until_its_blank_line() {
        let mut parser = Parser::default();
        assert!(parser.push(b"id: 1\nevent: job_event\ndata: {}\n").is_empty());
        assert_eq!(parser.push(b"\n"), vec![frame("job_event", "{}", Some("1"))]);
    }
}
