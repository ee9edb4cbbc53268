package parse

import (
	"bytes"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"
)

// MaxRequestLen bounds a request the callout decodes. A request is a JWT holding the
// client's connect options and, on TLS, its certificate chain: a few KiB.
const MaxRequestLen = 64 << 10

// Request decodes and checks an authorization request: a JWT signed by the server (a
// server key), addressed to the callout, unexpired at now, naming the user key to answer
// for.
func Request(data []byte, now time.Time) (*jwt.AuthorizationRequestClaims, error) {
	if len(data) > MaxRequestLen {
		return nil, fmt.Errorf("request is %d bytes, want at most %d", len(data), MaxRequestLen)
	}
	if !bytes.HasPrefix(data, []byte("eyJ")) {
		return nil, errors.New("request is not a JWT (an encrypted request needs the callout's xkey, which this callout does not use)")
	}
	req, err := jwt.DecodeAuthorizationRequestClaims(string(data))
	if err != nil {
		return nil, fmt.Errorf("decode request: %w", err)
	}
	if !nkeys.IsValidPublicServerKey(req.Issuer) {
		return nil, fmt.Errorf("request is signed by %q, not a server", req.Issuer)
	}
	if req.Audience != "nats-authorization-request" {
		return nil, fmt.Errorf("request is for audience %q, not nats-authorization-request", req.Audience)
	}
	if !nkeys.IsValidPublicUserKey(req.UserNkey) {
		return nil, fmt.Errorf("request names user key %q, not a user key", req.UserNkey)
	}
	if req.Server.ID == "" {
		return nil, errors.New("request names no server id")
	}
	if req.Expires != 0 && time.Unix(req.Expires, 0).Before(now.Add(-time.Second)) {
		return nil, fmt.Errorf("request expired at %s", time.Unix(req.Expires, 0).UTC().Format(time.RFC3339))
	}
	return req, nil
}
