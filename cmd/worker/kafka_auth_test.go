package main_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl/scram"

	"github.com/inboxworker/inboxworker/internal/kafkatest"
	"github.com/inboxworker/inboxworker/internal/pgtest"
)

// TestKafkaSASLOverTLS runs the worker against a broker that takes only SCRAM-SHA-512 over TLS, as
// managed Kafka does: with the right credentials it joins its group; with a wrong password it ends
// at once with one line naming the setting, without the password.
func TestKafkaSASLOverTLS(t *testing.T) {
	t.Parallel()
	serverTLS, caFile := selfSignedTLS(t)
	addr, _ := startSASLBroker(t, serverTLS, floorMode())
	db := pgtest.Schema(t)
	env := func(password string) []string {
		return []string{
			"KAFKA_BROKERS=" + addr,
			"KAFKA_SASL_MECHANISM=SCRAM-SHA-512",
			"KAFKA_USERNAME=app",
			"KAFKA_PASSWORD=" + password,
			"KAFKA_TLS=true",
			"SSL_CERT_FILE=" + caFile, // the broker's certificate is trusted as a system root
			"KAFKA_SESSION_TIMEOUT=1s",
			"DATABASE_URL=" + db.URL,
			"HTTP_ADDR=127.0.0.1:0",
			"STARTUP_TIMEOUT=10s",
		}
	}

	t.Run("Joins", func(t *testing.T) {
		t.Parallel()
		p := startWorker(t, env("kafka-s3cret"), "run")
		p.waitLog("joined a generation of the consumer group")
		// Read, dead-lettered and committed: every client of the worker authenticated.
		produceOverSASL(t, addr, caFile, topicPayments, kafka.Message{Value: []byte("not JSON")})
		p.waitLog("dead-lettered the message")
		p.signal(syscall.SIGTERM)
		if code := p.wait(); code != 0 {
			t.Errorf("exit code %d after SIGTERM, want 0", code)
		}
		checkNoSecret(t, p, "kafka-s3cret")
	})
	t.Run("WrongPassword", func(t *testing.T) {
		t.Parallel()
		// Long enough for a TLS handshake and the hang-up on a loaded machine: with less, the
		// deadline can come first and the hint below is rightly absent.
		p := startWorker(t, append(env("wrong-s3cret"), "STARTUP_TIMEOUT=3s"), "run")
		if code := p.wait(); code != 1 {
			t.Errorf("exit code %d, want 1", code)
		}
		// A real broker answers SaslAuthenticationFailed, and the worker names KAFKA_USERNAME at
		// once; kfake hangs up instead, which the worker cannot tell from a broker down.
		_, lines := p.output()
		want := fmt.Sprintf("worker: KAFKA_BROKERS: Kafka at %s unreachable after 3s: ", addr)
		hint := "(the brokers hung up: check KAFKA_TLS, KAFKA_SASL_MECHANISM, KAFKA_USERNAME and KAFKA_PASSWORD)"
		if last := lines[len(lines)-1]; !strings.HasPrefix(last, want) || !strings.HasSuffix(last, hint) {
			t.Errorf("last line %q, want %q…%q", last, want, hint)
		}
		checkNoSecret(t, p, "wrong-s3cret")
	})
}

func checkNoSecret(t *testing.T, p *process, secret string) {
	t.Helper()
	stdout, lines := p.output()
	for _, l := range append(lines, stdout) {
		if strings.Contains(l, secret) {
			t.Errorf("the password is in the output: %s", l)
		}
	}
}

// selfSignedTLS returns a server configuration with a self-signed certificate for 127.0.0.1 and the
// path of that certificate in PEM, for clients to trust.
func selfSignedTLS(t *testing.T) (*tls.Config, string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	template := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, template, template, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	caFile := filepath.Join(t.TempDir(), "broker.pem")
	if err := os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}}, caFile
}

// produceOverSASL writes msgs to topic as the user app over TLS, trusting the certificate in caFile.
func produceOverSASL(t *testing.T, addr, caFile, topic string, msgs ...kafka.Message) {
	t.Helper()
	ca, err := os.ReadFile(caFile)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca)
	mechanism, err := scram.Mechanism(scram.SHA512, "app", "kafka-s3cret")
	if err != nil {
		t.Fatal(err)
	}
	transport := &kafka.Transport{ClientID: kafkatest.ClientID, SASL: mechanism, TLS: &tls.Config{RootCAs: roots}}
	defer transport.CloseIdleConnections()
	w := &kafka.Writer{Addr: kafka.TCP(addr), Transport: transport, Topic: topic, RequiredAcks: kafka.RequireAll, BatchTimeout: time.Millisecond}
	defer w.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := w.WriteMessages(ctx, msgs...); err != nil {
		t.Fatalf("produce to %s over SASL: %v", topic, err)
	}
}
