package push

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"log/slog"
	"time"

	"edgegw/stats"
)

// What the upstream says in the log: every change of a link's state and of
// the path is one line at the change, never one per retry. While a link
// keeps failing for the same reason, one line a minute repeats it with the
// number of attempts ("repeated") and how long it has held ("since").
//
//	push: upstream path                path=mqtt was=buffering for=12s
//	push: websocket: cannot connect    err="dial tcp …: connection refused"
//	push: websocket: receiver answered the handshake but acknowledged no batch; counted as down
//	                                   reason="no ack within 10s" err=… retry_in=4s
//	push: websocket: connected         (at the first batch acknowledged, not at the handshake)
//	push: mqtt: cannot connect         err="network Error : tls: failed to verify certificate: x509: …"
//	                                   cert_subject="CN=broker" cert_issuer="CN=other CA"
//	push: mqtt: connected              was="failed: …" for=40s

// setPath records the path the batches take and logs a change: Info when a
// path carries them, Warn when none does (buffering, unauthorized). The
// dispatcher in Run is its only caller.
func (p *Pusher) setPath(path string) {
	old, _ := p.st.Path.Load().(string)
	if old == path {
		return
	}
	now := time.Now()
	was := p.st.PathSinceUS.Load()
	p.st.Path.Store(path)
	p.st.PathSinceUS.Store(now.UnixMicro())
	if old == "" {
		return // New: the initial state, not a change
	}
	level := slog.LevelInfo
	if path == stats.PathBuffering || path == stats.PathUnauthorized {
		level = slog.LevelWarn
	}
	args := []any{"path", path, "was", old}
	if was > 0 {
		args = append(args, "for", now.Sub(time.UnixMicro(was)).Round(time.Millisecond))
	}
	if path == stats.PathBuffering {
		args = append(args, "queue_samples", p.st.QueueSamples.Load())
	}
	p.log.Log(context.Background(), level, "push: upstream path", args...)
}

// failState is the state key of a failing link: the same reason is the
// same state.
func failState(kind string, err error) string {
	if err == nil {
		return kind
	}
	return kind + ": " + err.Error()
}

// errArgs is err with, for a certificate that failed verification, what
// was wrong with it: the subject and issuer of the certificate the server
// sent (the x509 message names the complaint).
func errArgs(err error) []any {
	args := []any{"err", err}
	var cv *tls.CertificateVerificationError
	if errors.As(err, &cv) && len(cv.UnverifiedCertificates) > 0 {
		c := cv.UnverifiedCertificates[0]
		args = append(args, "cert_subject", c.Subject.String(), "cert_issuer", c.Issuer.String())
		var inv x509.CertificateInvalidError
		if errors.As(err, &inv) && inv.Reason == x509.Expired {
			args = append(args, "cert_not_after", c.NotAfter.UTC().Format(time.RFC3339))
		}
	}
	return args
}
