// Package parse reads what reaches gpuscaler's auth callout from outside: the NATS
// server's authorization requests, the clients' ServiceAccount tokens, and the
// static-users file. Every function here is fuzzed. It is a package of its own, with few
// dependencies, so that its fuzz targets run in a small test binary: Go's fuzzer scans
// the coverage counters of every package a test binary links, and the callout's own
// tests link a NATS server and a Kubernetes client, which makes each execution ~15× slower.
package parse

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
)

// MaxTokenLen bounds a token the callout will look at. Kubernetes ServiceAccount tokens
// are about 1 KiB; 16 KiB leaves room for long names and extra claims.
const MaxTokenLen = 16 << 10

// TokenClaims are the claims of a ServiceAccount token that the callout reads without
// verifying them. The apiserver's TokenReview is what verifies a token; these only let
// the callout refuse a token that is plainly expired or for another audience without
// asking the apiserver, and learn when a verified token expires, which TokenReview does
// not say.
type TokenClaims struct {
	Expires  time.Time
	Audience []string
}

// ErrNotJWT reports a token that is not a JSON Web Token.
var ErrNotJWT = errors.New("not a JSON Web Token")

// Token reads the expiry and audience of a JWT (header.payload.signature), without
// verifying its signature.
func Token(token string) (TokenClaims, error) {
	if len(token) > MaxTokenLen {
		return TokenClaims{}, fmt.Errorf("%w: %d bytes, want at most %d", ErrNotJWT, len(token), MaxTokenLen)
	}
	parts := strings.Split(token, ".")
	if len(parts) != 3 || parts[0] == "" || parts[1] == "" || parts[2] == "" {
		return TokenClaims{}, fmt.Errorf("%w: want three dot-separated parts", ErrNotJWT)
	}
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return TokenClaims{}, fmt.Errorf("%w: payload is not base64url: %v", ErrNotJWT, err)
	}
	var raw struct {
		Exp *json.Number    `json:"exp"`
		Aud json.RawMessage `json:"aud"`
	}
	dec := json.NewDecoder(strings.NewReader(string(payload)))
	dec.UseNumber()
	if err := dec.Decode(&raw); err != nil {
		return TokenClaims{}, fmt.Errorf("%w: payload is not a JSON object: %v", ErrNotJWT, err)
	}
	var c TokenClaims
	if raw.Exp == nil {
		return TokenClaims{}, fmt.Errorf("%w: no exp claim (a projected ServiceAccount token always has one)", ErrNotJWT)
	}
	exp, err := raw.Exp.Int64()
	if err != nil || exp <= 0 {
		return TokenClaims{}, fmt.Errorf("%w: exp claim %s is not a positive whole number of seconds", ErrNotJWT, raw.Exp.String())
	}
	c.Expires = time.Unix(exp, 0)
	// RFC 7519 4.1.3: aud is one string or an array of strings.
	switch {
	case len(raw.Aud) == 0 || string(raw.Aud) == "null":
	case raw.Aud[0] == '"':
		var one string
		if err := json.Unmarshal(raw.Aud, &one); err != nil {
			return TokenClaims{}, fmt.Errorf("%w: aud claim: %v", ErrNotJWT, err)
		}
		c.Audience = []string{one}
	default:
		if err := json.Unmarshal(raw.Aud, &c.Audience); err != nil {
			return TokenClaims{}, fmt.Errorf("%w: aud claim is neither a string nor an array of strings: %v", ErrNotJWT, err)
		}
	}
	return c, nil
}

// HasAudience reports whether aud is among the token's audiences.
func (c TokenClaims) HasAudience(aud string) bool { return slices.Contains(c.Audience, aud) }
