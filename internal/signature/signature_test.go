package signature_test

import (
	"crypto/ed25519"
	"encoding/base64"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/inboxworker/inboxworker"
	"github.com/inboxworker/inboxworker/internal/signature"
)

var (
	oldSecret              = []byte("0123456789abcdef0123456789abcdef")
	newSecret              = []byte("fedcba9876543210fedcba9876543210")
	edPublic, edPrivate, _ = ed25519.GenerateKey(strings.NewReader(strings.Repeat("seed", 16)))
)

func keyList() string {
	return "old:whsec_" + base64.StdEncoding.EncodeToString(oldSecret) +
		", new:whsec_" + base64.StdEncoding.EncodeToString(newSecret) +
		",ed:whpk_" + base64.StdEncoding.EncodeToString(edPublic)
}

func verifier(tb testing.TB, list string) *signature.Verifier {
	tb.Helper()
	keys, err := signature.ParseKeys(list)
	if err != nil {
		tb.Fatal(err)
	}
	v, err := signature.NewVerifier(keys, 5*time.Minute)
	if err != nil {
		tb.Fatal(err)
	}
	return v
}

// signed is a callback signed at produced by sig, as a receiver forwards it.
func signed(id string, at time.Time, body string, sig string) inboxworker.Received {
	return inboxworker.Received{Value: []byte(body), Produced: at, Headers: []inboxworker.Header{
		{Key: "webhook-id", Value: []byte(id)},
		{Key: "webhook-timestamp", Value: []byte(strconv.FormatInt(at.Unix(), 10))},
		{Key: "webhook-signature", Value: []byte(sig)},
	}}
}

func TestVerify(t *testing.T) {
	v := verifier(t, keyList())
	at := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	body := `{"order_no":"A1","result":"SUCCESS"}`
	ts := at.Unix()
	hmacOld := signature.Sign(oldSecret, "msg_1", ts, []byte(body))
	hmacNew := signature.Sign(newSecret, "msg_1", ts, []byte(body))
	ed := signature.SignEd25519(edPrivate, "msg_1", ts, []byte(body))
	_, otherPrivate, _ := ed25519.GenerateKey(strings.NewReader(strings.Repeat("other", 13)))
	forged := signature.Sign([]byte("not-the-providers-secret-at-all"), "msg_1", ts, []byte(body))

	for _, tc := range []struct {
		name    string
		m       inboxworker.Received
		key     string
		problem error
	}{
		{"hmac", signed("msg_1", at, body, hmacOld), "old", nil},
		{"ed25519", signed("msg_1", at, body, ed), "ed", nil},
		{"rotation: new key among several signatures", signed("msg_1", at, body, "v2,abc "+hmacNew+" "+hmacOld), "old", nil},
		{"rotation: new key alone", signed("msg_1", at, body, hmacNew), "new", nil},
		{"record produced 4m59s after signing", withProduced(signed("msg_1", at, body, hmacOld), at.Add(4*time.Minute+59*time.Second)), "old", nil},
		{"headers in another case", func() inboxworker.Received {
			m := signed("msg_1", at, body, ed)
			for i := range m.Headers {
				m.Headers[i].Key = strings.ToUpper(m.Headers[i].Key)
			}
			return m
		}(), "ed", nil},
		{"unsigned", inboxworker.Received{Value: []byte(body), Produced: at}, "", inboxworker.ErrUnsigned},
		{"forged", signed("msg_1", at, body, forged), "", inboxworker.ErrNoKeyMatched},
		{"ed25519 of another key", signed("msg_1", at, body, signature.SignEd25519(otherPrivate, "msg_1", ts, []byte(body))), "", inboxworker.ErrNoKeyMatched},
		{"tampered: one byte of the value", signed("msg_1", at, strings.Replace(body, "A1", "A2", 1), hmacOld), "", inboxworker.ErrNoKeyMatched},
		{"tampered: the id", signed("msg_2", at, body, hmacOld), "", inboxworker.ErrNoKeyMatched},
		{"only versions it does not know", signed("msg_1", at, body, "v2,"+hmacOld[3:]), "", inboxworker.ErrNoKeyMatched},
		{"stale: signed 6m before the record", withProduced(signed("msg_1", at, body, hmacOld), at.Add(6*time.Minute)), "", inboxworker.ErrSignatureTimestamp},
		{"signed 6m after the record", withProduced(signed("msg_1", at, body, hmacOld), at.Add(-6*time.Minute)), "", inboxworker.ErrSignatureTimestamp},
		{"record without a timestamp", withProduced(signed("msg_1", at, body, hmacOld), time.Time{}), "", inboxworker.ErrSignatureTimestamp},
		{"no webhook-id", without(signed("msg_1", at, body, hmacOld), "webhook-id"), "", inboxworker.ErrSignatureMalformed},
		{"no signature", without(signed("msg_1", at, body, hmacOld), "webhook-signature"), "", inboxworker.ErrSignatureMalformed},
		{"timestamp not a number", withHeader(signed("msg_1", at, body, hmacOld), "webhook-timestamp", "yesterday"), "", inboxworker.ErrSignatureMalformed},
		{"signature not base64", signed("msg_1", at, body, "v1,!!!"), "", inboxworker.ErrSignatureMalformed},
		{"signature without a version", signed("msg_1", at, body, "abc"), "", inboxworker.ErrSignatureMalformed},
		{"id given twice", func() inboxworker.Received {
			m := signed("msg_1", at, body, hmacOld)
			m.Headers = append(m.Headers, inboxworker.Header{Key: "Webhook-Id", Value: []byte("msg_2")})
			return m
		}(), "", inboxworker.ErrSignatureMalformed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key, err := v.Verify(tc.m)
			switch {
			case tc.problem == nil && err != nil:
				t.Fatalf("Verify: %v; want verified by %s", err, tc.key)
			case tc.problem == nil && key != tc.key:
				t.Fatalf("verified by %q, want %q", key, tc.key)
			case tc.problem != nil && !errors.Is(err, tc.problem):
				t.Fatalf("Verify = %q, %v; want an error wrapping %v", key, err, tc.problem)
			}
			if err != nil && strings.Contains(err.Error(), base64.StdEncoding.EncodeToString(oldSecret)) {
				t.Fatalf("the error shows a secret: %v", err)
			}
		})
	}
}

func withProduced(m inboxworker.Received, at time.Time) inboxworker.Received {
	m.Produced = at
	return m
}

func without(m inboxworker.Received, name string) inboxworker.Received {
	var hs []inboxworker.Header
	for _, h := range m.Headers {
		if h.Key != name {
			hs = append(hs, h)
		}
	}
	m.Headers = hs
	return m
}

func withHeader(m inboxworker.Received, name, value string) inboxworker.Received {
	m = without(m, name)
	m.Headers = append(m.Headers, inboxworker.Header{Key: name, Value: []byte(value)})
	return m
}

func TestParseKeys(t *testing.T) {
	secret := base64.StdEncoding.EncodeToString(oldSecret)
	keys, err := signature.ParseKeys(keyList())
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(keys.Names(), ","); got != "old,new,ed" {
		t.Fatalf("names %s, want old,new,ed", got)
	}
	for _, bad := range []string{
		"",
		"whsec_" + secret,
		"a b:whsec_" + secret,
		"a:whsec_" + secret + ",a:whsec_" + secret,
		"a:whsec_c2hvcnQ=",
		"a:whsec_***",
		"a:whpk_c2hvcnQ=",
		"a:" + secret,
	} {
		_, err := signature.ParseKeys(bad)
		if err == nil {
			t.Errorf("ParseKeys(%q) accepted it", bad)
			continue
		}
		if strings.Contains(err.Error(), secret) {
			t.Errorf("ParseKeys(%q) shows the secret: %v", bad, err)
		}
	}
}

// BenchmarkVerify is one callback verified, by an HMAC secret and by an Ed25519 key, each among
// the three keys of a rotation.
func BenchmarkVerify(b *testing.B) {
	v := verifier(b, keyList())
	at := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	body := []byte(`{"event_id":"evt-00000001","order_no":"ORD-00000001","provider":"alipay","provider_txn_id":"TXN-00000001","amount":"11.01","currency":"CNY","result":"SUCCESS","paid_at":"2026-11-30T12:00:00Z"}`)
	for name, sig := range map[string]string{
		"HMAC":    signature.Sign(newSecret, "msg_1", at.Unix(), body),
		"Ed25519": signature.SignEd25519(edPrivate, "msg_1", at.Unix(), body),
	} {
		m := signed("msg_1", at, string(body), sig)
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := v.Verify(m); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
