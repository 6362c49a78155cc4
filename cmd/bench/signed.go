package main

import (
	"crypto/ed25519"
	"encoding/base64"
	"strconv"
	"strings"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/inboxworker/inboxworker"
	"github.com/inboxworker/inboxworker/internal/signature"
)

// signing is how the stream's callbacks are signed, as a provider signs them (Standard Webhooks):
// not at all, with an HMAC secret (v1), or with an Ed25519 key (v1a). The signed modes measure what
// verifying costs the worker (PAYMENT_SIGNATURE=standard-webhooks).
type signing string

const (
	unsigned      signing = ""
	signedHMAC    signing = "hmac"
	signedEd25519 signing = "ed25519"
)

// modeSigning is the signing of each signed mode's stream.
var modeSigning = map[string]signing{"batch_hmac": signedHMAC, "batch_ed25519": signedEd25519}

var (
	benchSecret                  = []byte("the-bench-provider-webhook-secret")
	benchPublic, benchPrivate, _ = ed25519.GenerateKey(strings.NewReader(strings.Repeat("bench-key", 8)))
)

// headers returns the Standard Webhooks headers of the callback value whose id is id, signed now.
func (s signing) headers(id string, value []byte) []kafka.Header {
	at := time.Now().Unix()
	var sig string
	if s == signedHMAC {
		sig = signature.Sign(benchSecret, id, at, value)
	} else {
		sig = signature.SignEd25519(benchPrivate, id, at, value)
	}
	return []kafka.Header{
		{Key: "webhook-id", Value: []byte(id)},
		{Key: "webhook-timestamp", Value: []byte(strconv.FormatInt(at, 10))},
		{Key: "webhook-signature", Value: []byte(sig)},
	}
}

// verify is the verification of the signed stream as the worker's payment route makes it; nil when
// the stream is not signed.
func (s signing) verify() (func(kafka.Message) (string, error), error) {
	if s == unsigned {
		return nil, nil
	}
	key := "bench:whsec_" + base64.StdEncoding.EncodeToString(benchSecret)
	if s == signedEd25519 {
		key = "bench:whpk_" + base64.StdEncoding.EncodeToString(benchPublic)
	}
	keys, err := signature.ParseKeys(key)
	if err != nil {
		return nil, err
	}
	v, err := signature.NewVerifier(keys, 5*time.Minute)
	if err != nil {
		return nil, err
	}
	// As inboxworker.Route.Verify wires it.
	return func(m kafka.Message) (string, error) {
		headers := make([]inboxworker.Header, len(m.Headers))
		for i, h := range m.Headers {
			headers[i] = inboxworker.Header(h)
		}
		return v.Verify(inboxworker.Received{Value: m.Value, Headers: headers, Produced: m.Time})
	}, nil
}
