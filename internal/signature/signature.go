// Package signature verifies payment callbacks signed as the Standard Webhooks specification says
// (https://www.standardwebhooks.com): the headers webhook-id, webhook-timestamp (Unix seconds) and
// webhook-signature, a space-separated list of "v1,<base64 HMAC-SHA256>" and "v1a,<base64
// Ed25519>" signatures over "{webhook-id}.{webhook-timestamp}.{body}", the body being the Kafka
// value byte for byte.
//
// Its one departure from the specification's libraries is time: they check the timestamp against
// the clock, which a consumer cannot (a callback may wait in Kafka, in the park or in the
// dead-letter topic longer than any tolerance). It is checked against the record's timestamp, when
// the receiver produced the callback: so a verdict depends on the message alone, and a message
// parked, redelivered or replayed verifies as it did when it arrived.
package signature

import (
	"bytes"
	"crypto/ed25519"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/inboxworker/inboxworker"
)

// The headers of a signed callback.
const (
	HeaderID        = "webhook-id"
	HeaderTimestamp = "webhook-timestamp"
	HeaderSignature = "webhook-signature"
)

// A key's bounds: an HMAC secret of fewer bytes is too easily guessed (the specification asks for
// 24 to 64 random bytes); more is a mistake.
const (
	minSecretLen = 16
	maxSecretLen = 512
	maxNameLen   = 64
)

// key is one key of a Verifier: a secret (HMAC-SHA256, "whsec_") or an Ed25519 public key ("whpk_").
type key struct {
	name   string
	secret []byte
	public ed25519.PublicKey
}

// Keys are the keys a Verifier accepts, parsed from PAYMENT_SIGNING_KEYS.
type Keys []key

// ParseKeys parses a comma-separated list of NAME:KEY, KEY being whsec_<base64 secret> or
// whpk_<base64 Ed25519 public key>. Names are 1 to 64 letters, digits, '.', '_' or '-', each once.
// Its errors name the key, never show it.
func ParseKeys(list string) (Keys, error) {
	var keys Keys
	for item := range strings.SplitSeq(list, ",") {
		name, encoded, ok := strings.Cut(strings.TrimSpace(item), ":")
		switch {
		case !ok:
			return nil, errors.New("each key is NAME:whsec_<base64> or NAME:whpk_<base64>")
		case !validName(name):
			return nil, fmt.Errorf("key name %q: 1 to %d letters, digits, '.', '_' or '-'", name, maxNameLen)
		}
		for _, k := range keys {
			if k.name == name {
				return nil, fmt.Errorf("key %s is given twice", name)
			}
		}
		k, err := parseKey(name, encoded)
		if err != nil {
			return nil, fmt.Errorf("key %s: %w", name, err)
		}
		keys = append(keys, k)
	}
	return keys, nil
}

func parseKey(name, encoded string) (key, error) {
	if secret, ok := strings.CutPrefix(encoded, "whsec_"); ok {
		b, err := base64.StdEncoding.DecodeString(secret)
		switch {
		case err != nil:
			return key{}, errors.New("whsec_ must be followed by base64")
		case len(b) < minSecretLen || len(b) > maxSecretLen:
			return key{}, fmt.Errorf("a secret of %d bytes: use %d to %d", len(b), minSecretLen, maxSecretLen)
		}
		return key{name: name, secret: b}, nil
	}
	if public, ok := strings.CutPrefix(encoded, "whpk_"); ok {
		b, err := base64.StdEncoding.DecodeString(public)
		if err != nil || len(b) != ed25519.PublicKeySize {
			return key{}, fmt.Errorf("whpk_ must be followed by the base64 of a %d-byte Ed25519 public key", ed25519.PublicKeySize)
		}
		return key{name: name, public: ed25519.PublicKey(b)}, nil
	}
	return key{}, errors.New("a key begins with whsec_ (HMAC-SHA256 secret) or whpk_ (Ed25519 public key)")
}

func validName(name string) bool {
	if name == "" || len(name) > maxNameLen {
		return false
	}
	for _, c := range []byte(name) {
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// Names are the keys' names, in order: what the worker may show of them.
func (ks Keys) Names() []string {
	names := make([]string, len(ks))
	for i, k := range ks {
		names[i] = k.name
	}
	return names
}

// Verifier verifies Standard Webhooks signatures against its keys: an inboxworker.Verifier. It is
// safe for concurrent use.
type Verifier struct {
	keys      Keys
	tolerance time.Duration
}

// NewVerifier returns a Verifier of keys (at least one) that accepts a signature made at most
// tolerance before or after its record was produced.
func NewVerifier(keys Keys, tolerance time.Duration) (*Verifier, error) {
	if len(keys) == 0 {
		return nil, errors.New("signature: no key")
	}
	if tolerance <= 0 {
		return nil, errors.New("signature: the tolerance must be positive")
	}
	return &Verifier{keys: keys, tolerance: tolerance}, nil
}

// Verify returns the name of the first key that matches one of m's signatures, or why none does:
// an error wrapping inboxworker.ErrUnsigned (none of the three headers), ErrSignatureMalformed (one
// missing, repeated with another value, or unreadable), ErrNoKeyMatched, or ErrSignatureTimestamp
// (a signature that matches, made more than the tolerance from m.Produced). Signatures are compared
// in constant time; one of a version it does not know is ignored, as the specification says.
func (v *Verifier) Verify(m inboxworker.Received) (string, error) {
	h, err := readHeaders(m.Headers)
	if err != nil {
		return "", err
	}
	name, err := v.match(h, m.Value)
	if err != nil {
		return "", err
	}
	signedAt := time.Unix(h.timestamp, 0)
	if m.Produced.IsZero() {
		return "", fmt.Errorf("%w: the record has no timestamp to check webhook-timestamp against", inboxworker.ErrSignatureTimestamp)
	}
	if d := m.Produced.Sub(signedAt); d > v.tolerance || -d > v.tolerance {
		return "", fmt.Errorf("%w: signed at %s, %s the record was produced (%s); the tolerance is %s",
			inboxworker.ErrSignatureTimestamp, signedAt.UTC().Format(time.RFC3339), distance(d),
			m.Produced.UTC().Format(time.RFC3339Nano), v.tolerance)
	}
	return name, nil
}

// distance says how far a signature was made from its record: d is the record's time less the
// signature's.
func distance(d time.Duration) string {
	if d >= 0 {
		return d.Round(time.Second).String() + " before"
	}
	return (-d).Round(time.Second).String() + " after"
}

// headers are the Standard Webhooks headers of a message.
type headers struct {
	id, timestampText string
	timestamp         int64
	signatures        string
}

// readHeaders reads the three headers, matched in any case. A header given twice must say the same.
func readHeaders(hs []inboxworker.Header) (headers, error) {
	var h headers
	found := 0
	for _, name := range [...]string{HeaderID, HeaderTimestamp, HeaderSignature} {
		value, err := header(hs, name)
		if err != nil {
			return headers{}, err
		}
		if value != "" {
			found++
		}
		switch name {
		case HeaderID:
			h.id = value
		case HeaderTimestamp:
			h.timestampText = value
		case HeaderSignature:
			h.signatures = value
		}
	}
	switch {
	case found == 0:
		return headers{}, fmt.Errorf("%w: no header %s, %s or %s", inboxworker.ErrUnsigned, HeaderID, HeaderTimestamp, HeaderSignature)
	case h.id == "":
		return headers{}, malformed("no header %s", HeaderID)
	case h.timestampText == "":
		return headers{}, malformed("no header %s", HeaderTimestamp)
	case h.signatures == "":
		return headers{}, malformed("no header %s", HeaderSignature)
	}
	ts, err := strconv.ParseInt(h.timestampText, 10, 64)
	if err != nil || ts < 0 || ts > 1<<40 {
		return headers{}, malformed("%s is not Unix seconds: %.40q", HeaderTimestamp, h.timestampText)
	}
	h.timestamp = ts
	return h, nil
}

// header returns the value of the headers named name, "" when there is none.
func header(hs []inboxworker.Header, name string) (string, error) {
	var value []byte
	for _, h := range hs {
		if !strings.EqualFold(h.Key, name) {
			continue
		}
		if value != nil && !bytes.Equal(value, h.Value) {
			return "", malformed("header %s is given twice with different values", name)
		}
		value = h.Value
	}
	return string(value), nil
}

func malformed(format string, args ...any) error {
	return fmt.Errorf("%w: %s", inboxworker.ErrSignatureMalformed, fmt.Sprintf(format, args...))
}

// match returns the name of the first key that matches a signature of h over body.
func (v *Verifier) match(h headers, body []byte) (string, error) {
	hmacs, ed25519s, err := parseSignatures(h)
	if err != nil {
		return "", err
	}
	var content []byte // what an Ed25519 signature signs, made once if needed
	for _, k := range v.keys {
		switch {
		case k.secret != nil && len(hmacs) > 0:
			mac := hmac.New(sha256.New, k.secret)
			mac.Write([]byte(h.id))
			mac.Write([]byte{'.'})
			mac.Write([]byte(h.timestampText))
			mac.Write([]byte{'.'})
			mac.Write(body)
			sum := mac.Sum(nil)
			for _, s := range hmacs {
				if hmac.Equal(sum, s) {
					return k.name, nil
				}
			}
		case k.public != nil && len(ed25519s) > 0:
			if content == nil {
				content = signedContent(h, body)
			}
			for _, s := range ed25519s {
				if len(s) == ed25519.SignatureSize && ed25519.Verify(k.public, content, s) {
					return k.name, nil
				}
			}
		}
	}
	return "", fmt.Errorf("%w: %d v1 and %d v1a signatures, none by keys %s", inboxworker.ErrNoKeyMatched,
		len(hmacs), len(ed25519s), strings.Join(v.keys.Names(), ", "))
}

// parseSignatures returns the signatures of h: the HMAC ones (v1) and the Ed25519 ones (v1a),
// decoded; those of another version are left out.
func parseSignatures(h headers) (hmacs, ed25519s [][]byte, _ error) {
	for sig := range strings.FieldsSeq(h.signatures) {
		version, encoded, ok := strings.Cut(sig, ",")
		if !ok {
			return nil, nil, malformed("%s holds %.20q, not version,signature", HeaderSignature, sig)
		}
		b, err := base64.StdEncoding.DecodeString(encoded)
		switch {
		case version != "v1" && version != "v1a":
			continue
		case err != nil:
			return nil, nil, malformed("a %s signature is not base64", version)
		case version == "v1":
			hmacs = append(hmacs, b)
		default:
			ed25519s = append(ed25519s, b)
		}
	}
	return hmacs, ed25519s, nil
}

// signedContent is what a signature of h over body signs.
func signedContent(h headers, body []byte) []byte {
	content := make([]byte, 0, len(h.id)+len(h.timestampText)+2+len(body))
	content = append(content, h.id...)
	content = append(content, '.')
	content = append(content, h.timestampText...)
	content = append(content, '.')
	return append(content, body...)
}

// Sign returns the v1 signature of id, timestamp and body by the HMAC secret: what a provider puts
// in webhook-signature, for the tests and the demo.
func Sign(secret []byte, id string, timestamp int64, body []byte) string {
	mac := hmac.New(sha256.New, secret)
	mac.Write(signedContent(headers{id: id, timestampText: strconv.FormatInt(timestamp, 10)}, body))
	return "v1," + base64.StdEncoding.EncodeToString(mac.Sum(nil))
}

// SignEd25519 returns the v1a signature of id, timestamp and body by private.
func SignEd25519(private ed25519.PrivateKey, id string, timestamp int64, body []byte) string {
	content := signedContent(headers{id: id, timestampText: strconv.FormatInt(timestamp, 10)}, body)
	return "v1a," + base64.StdEncoding.EncodeToString(ed25519.Sign(private, content))
}
