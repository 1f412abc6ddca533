// A networked tab's last word: when the page goes (closed, reloaded, navigated away), its
// rank's worker may be blocked in a step and is torn down with the page before it could say
// that it leaves, so the other ranks would wait out the 5 s failure bound. The page keeps the
// rank's leaving frames instead (`World.leavingMessage()`, sealed by the rank's key in the
// worker) and a NATS connection of its own over the server's WebSocket listener, and publishes
// them from `pagehide`: a WebSocket's `send` hands the bytes to the browser at once, so they go
// out even as the page is torn down. The others count the rank gone half a second later.
//
// The connection speaks the NATS client protocol's few words it needs: CONNECT (as the run's
// user when the link carries a secret), PONG to the server's PING, and PUB.

const encoder = new TextEncoder();

/** `PUB subject n\r\n` + payload + `\r\n`, as one binary WebSocket message. */
function pub(subject, payload) {
  const head = encoder.encode(`PUB ${subject} ${payload.length}\r\n`);
  const out = new Uint8Array(head.length + payload.length + 2);
  out.set(head);
  out.set(payload, head.length);
  out.set([13, 10], head.length + payload.length);
  return out;
}

/**
 * Connects to `ws` (the NATS server's WebSocket listener) and keeps `leaving` (`{subject,
 * frames}`) for {@link LastWord#send}. `run` and `secret`: the run's user, on a server with a
 * user per run. A connection that fails is dropped quietly: the rank then leaves as a silent
 * one does, after the failure bound.
 */
export function lastWord({ ws, run, secret, leaving }) {
  const socket = new WebSocket(ws);
  socket.binaryType = 'arraybuffer';
  let connected = false;
  socket.onmessage = ({ data }) => {
    const text = typeof data === 'string' ? data : new TextDecoder().decode(data);
    if (!connected && text.startsWith('INFO ')) {
      const credentials = secret ? { user: run, pass: secret } : {};
      const options = { verbose: false, pedantic: false, lang: 'distopt-demo', version: '1', protocol: 1, name: `distopt demo tab (run ${run}, last word)`, ...credentials };
      socket.send(encoder.encode(`CONNECT ${JSON.stringify(options)}\r\n`));
      connected = true;
    }
    // The server's keep-alive: a connection that does not answer is closed.
    if (/(^|\n)PING\r\n/.test(text)) socket.send(encoder.encode('PONG\r\n'));
  };
  socket.onerror = () => {};
  return {
    /** Publishes the leaving frames (once; nothing when the connection is not up). */
    send() {
      if (!connected || socket.readyState !== WebSocket.OPEN) return false;
      for (const frame of leaving.frames) socket.send(pub(leaving.subject, frame));
      connected = false;
      return true;
    },
    close() {
      connected = false;
      socket.close();
    },
  };
}
