package serve

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Signed file URLs: what the SDKs' downloadUrl and uploadUrl give a
// browser or any HTTP client, which holds no token. The signature is
// E2B's envd's: "v1_" and the unpadded base64 of the SHA-256 of
// PATH:OPERATION:USER:TOKEN, with :EXPIRY (Unix seconds) appended when
// the URL expires, where OPERATION is read (GET /files) or write (POST
// /files), USER the username parameter (empty for the default user) and
// TOKEN the sandbox's envd token of its current generation: replacing
// the tokens revokes every signed URL at once. Decision 0048.

// Signed URLs' query parameters.
const (
	signatureParam  = "signature"
	signatureExpiry = "signature_expiration"
)

// signedFiles tells whether r asks for /files by a signature instead of
// the envd token: it carries no X-Access-Token and a signature
// parameter.
func signedFiles(r *http.Request) bool {
	if r.URL.Path != "/files" || r.Header.Get("X-Access-Token") != "" {
		return false
	}
	switch r.Method {
	case http.MethodGet, http.MethodHead, http.MethodPost:
	default:
		return false
	}
	_, ok := r.URL.Query()[signatureParam]
	return ok
}

// fileOperation is what a /files request does, as signatures name it.
func fileOperation(method string) string {
	if method == http.MethodPost {
		return "write"
	}
	return "read"
}

// fileSignature is the signature of operation on path as user with
// token, expiring at expiry (Unix seconds) if it is not nil.
func fileSignature(path, operation, user, token string, expiry *int64) string {
	raw := strings.Join([]string{path, operation, user, token}, ":")
	if expiry != nil {
		raw += ":" + strconv.FormatInt(*expiry, 10)
	}
	sum := sha256.Sum256([]byte(raw))
	return "v1_" + base64.RawStdEncoding.EncodeToString(sum[:])
}

// signatureError is a signed request refused: answered 401 with E2B's
// body and envd's message.
type signatureError struct{ msg string }

func (e *signatureError) Error() string { return e.msg }

var errInvalidSignature = &signatureError{"invalid signature"}

// checkSignature checks r's signature against token (empty: the sandbox
// is not there, so no signature is valid) at now. An expiry in the past
// is refused before the signature is compared: what the answer says
// then depends on the URL alone, not on the sandbox or its token. A
// refusal is a *signatureError (401); a malformed expiry another error
// (400).
func checkSignature(r *http.Request, token string, now time.Time) error {
	q := r.URL.Query()
	sig := q.Get(signatureParam)
	if sig == "" {
		return &signatureError{"missing signature query parameter"}
	}
	var expiry *int64
	if v, ok := q[signatureExpiry]; ok {
		exp, err := strconv.ParseInt(v[0], 10, 64)
		if err != nil {
			return fmt.Errorf("invalid format for parameter %s: %q is not a Unix time in seconds", signatureExpiry, v[0])
		}
		if exp < now.Unix() {
			return &signatureError{"signature is already expired"}
		}
		expiry = &exp
	}
	if token == "" {
		return errInvalidSignature
	}
	want := fileSignature(q.Get("path"), fileOperation(r.Method), q.Get("username"), token, expiry)
	if subtle.ConstantTimeCompare([]byte(want), []byte(sig)) != 1 {
		return errInvalidSignature
	}
	return nil
}

// writeSignatureError answers a refused signed request: 401 for a
// signature that opens nothing, 400 for a malformed expiry.
func writeSignatureError(w http.ResponseWriter, err error) {
	var se *signatureError
	if errors.As(err, &se) {
		writeError(w, http.StatusUnauthorized, se.msg)
		return
	}
	writeError(w, http.StatusBadRequest, err.Error())
}
