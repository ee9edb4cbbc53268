package gateway

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"time"
)

// ReasonHeader says why the gateway itself answered instead of a backend, with one of
// the Reason values.
const ReasonHeader = "X-Gpuscaler-Reason"

// Why the gateway answered a request itself.
const (
	ReasonNoRoute       = "no-route"
	ReasonBodyTooLarge  = "body-too-large"
	ReasonOverflow      = "overflow"
	ReasonHoldTimeout   = "hold-timeout"
	ReasonRouteRemoved  = "route-removed"
	ReasonShuttingDown  = "shutting-down"
	ReasonUnreachable   = "upstream-unreachable"
	ReasonFirstByte     = "first-byte-timeout"
	ReasonIdleTimeout   = "idle-timeout"
	ReasonUpstreamError = "upstream-error"
)

// StatusClientClosed is what logs and metrics say of a request whose client went away
// before its response ended (nginx's 499); nothing is sent to that client.
const StatusClientClosed = 499

// Errors that end a held request; each is answered with its own status and reason.
var (
	errOverflow     = errors.New("too many requests held for the route")
	errHoldTimeout  = errors.New("no ready backend within the route's hold timeout")
	errClientGone   = errors.New("client went away")
	errRouteRemoved = errors.New("route removed by a routes reload")
	errIdleTimeout  = errors.New("upstream sent nothing within the idle timeout")
)

// apiError is an OpenAI-compatible error body, which OpenAI clients show as it is.
type apiError struct {
	Error struct {
		Message string `json:"message"`
		Type    string `json:"type"`
		Code    string `json:"code"`
	} `json:"error"`
}

// writeError answers with status, the reason header, a Retry-After when retryAfter is
// positive, and an OpenAI-compatible JSON body whose code is "gpuscaler_" and the
// reason with '_' for '-'.
func writeError(w http.ResponseWriter, status int, reason, msg string, retryAfter time.Duration) {
	var body apiError
	body.Error.Message = msg
	body.Error.Type = "server_error"
	if status < 500 {
		body.Error.Type = "invalid_request_error"
	}
	code := []byte("gpuscaler_" + reason)
	for i, c := range code {
		if c == '-' {
			code[i] = '_'
		}
	}
	body.Error.Code = string(code)
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set(ReasonHeader, reason)
	if retryAfter > 0 {
		h.Set("Retry-After", strconv.Itoa(int((retryAfter+time.Second-1)/time.Second)))
	}
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(&body) // the client may be gone; nothing to do then
}
