//! WebSocket helpers: a terminal's frames, as the PTY route sends them.

use std::net::TcpStream;

/// Reads binary frames until their text contains `want`; the text seen.
pub fn read_until(ws: &mut tungstenite::WebSocket<TcpStream>, want: &str) -> String {
    let mut seen = String::new();
    while !seen.contains(want) {
        match ws.read() {
            Ok(tungstenite::Message::Binary(b)) => seen.push_str(&String::from_utf8_lossy(&b)),
            Ok(_) => {}
            Err(e) => panic!("reading the terminal ({e}); seen so far: {seen:?}"),
        }
    }
    seen
}
