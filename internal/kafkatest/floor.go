package kafkatest

import (
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kbin"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Floor is a small Kafka proxy in front of one broker that holds every request to the versions an
// Apache Kafka 4.1 broker serves (see Kafka41), as 4.1 does: an ApiVersions request of a version it
// does not serve is answered UNSUPPORTED_VERSION with ApiVersions' own range (KIP-511; one above
// 4.1's is a newer client's first question, not outside), any other request outside the ranges has
// its connection closed. Its ApiVersions answers advertise 4.1's
// ranges (within what the broker behind implements). It records every request it passed, by client
// ID, API key and version, and can refuse an API on demand.
//
// It is a proxy rather than kfake's request control hooks (kfake.Cluster.ControlKey) because a hook
// sees neither the request's header nor its connection: a proxy tells the worker's clients (their
// client IDs) from the test's own producers and readers; sees a request kfake could not even parse;
// rewrites kfake's own ApiVersions answer, features included, rather than composing one; and leaves
// the hooks to the tests that inject faults with them. It costs a loopback hop per request, a TLS
// listener of its own when the clients use TLS, and the broker addresses rewritten in Metadata,
// FindCoordinator and DescribeCluster answers so that clients keep coming through it. One broker
// only: every broker address becomes the proxy's. SASL is passed through framed, as SaslHandshake
// v1 and SaslAuthenticate carry it; v0's unframed tokens are not.
type Floor struct {
	// Addr is the proxy's address: clients bootstrap from it.
	Addr string

	upstream string
	host     string
	port     int32
	ln       net.Listener
	wg       sync.WaitGroup

	mu       sync.Mutex
	conns    map[net.Conn]struct{}
	served   map[Request]struct{}
	outside  map[Request]struct{}
	refusals map[int16]Answer
}

// Request is one kind of request a client sent: who sent it, its API key and its version.
type Request struct {
	ClientID string
	Key      int16
	Version  int16
}

// Answer is how a refused request is answered: the response to send back, built from the request.
// A nil Answer closes the connection instead, as a broker does with a request it cannot serve.
type Answer func(kmsg.Request) kmsg.Response

// StartFloor starts a floor in front of the broker at upstream, with a TLS listener when tlsConfig
// is set (the proxy speaks plaintext to the broker). It stops when the test ends, and then fails
// the test, with the table of every request seen, if any request fell outside 4.1's versions.
func StartFloor(tb testing.TB, upstream string, tlsConfig *tls.Config) *Floor {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("kafkatest: floor listener: %v", err)
	}
	addr := ln.Addr().(*net.TCPAddr)
	if tlsConfig != nil {
		ln = tls.NewListener(ln, tlsConfig)
	}
	f := &Floor{
		Addr: addr.String(), upstream: upstream, host: addr.IP.String(), port: int32(addr.Port), ln: ln,
		conns: map[net.Conn]struct{}{}, served: map[Request]struct{}{}, outside: map[Request]struct{}{},
		refusals: map[int16]Answer{},
	}
	f.wg.Add(1)
	go f.accept()
	tb.Cleanup(func() {
		f.close()
		if outside := f.Outside(); len(outside) > 0 {
			tb.Errorf("kafkatest: requests outside the versions Kafka 4.1 serves: %v\n%s", outside,
				VersionTable(append(f.Served(), outside...)))
		}
	})
	return f
}

// Refuse makes the floor answer every request of API key with answer from now on (nil: close the
// connection), without passing it on. Such requests are still recorded.
func (f *Floor) Refuse(key int16, answer Answer) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.refusals[key] = answer
}

// Allow undoes Refuse.
func (f *Floor) Allow(key int16) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.refusals, key)
}

// Served returns the requests the floor passed on (or refused on demand), each kind once, sorted.
func (f *Floor) Served() []Request { return f.list(f.served) }

// Outside returns the requests outside 4.1's versions, each kind once, sorted.
func (f *Floor) Outside() []Request { return f.list(f.outside) }

func (f *Floor) list(set map[Request]struct{}) []Request {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]Request, 0, len(set))
	for r := range set {
		out = append(out, r)
	}
	slices.SortFunc(out, compareRequests)
	return out
}

func compareRequests(a, b Request) int {
	if a.Key != b.Key {
		return int(a.Key) - int(b.Key)
	}
	if a.Version != b.Version {
		return int(a.Version) - int(b.Version)
	}
	switch {
	case a.ClientID < b.ClientID:
		return -1
	case a.ClientID > b.ClientID:
		return 1
	}
	return 0
}

// CommitError answers an OffsetCommit request with code on each of its partitions, as a broker
// refusing the commit does (e.g. 30, GROUP_AUTHORIZATION_FAILED, for a group the client may not
// commit to).
func CommitError(code int16) Answer {
	return func(r kmsg.Request) kmsg.Response {
		req := r.(*kmsg.OffsetCommitRequest)
		resp := req.ResponseKind().(*kmsg.OffsetCommitResponse)
		for _, t := range req.Topics {
			rt := kmsg.NewOffsetCommitResponseTopic()
			rt.Topic = t.Topic
			for _, p := range t.Partitions {
				rp := kmsg.NewOffsetCommitResponseTopicPartition()
				rp.Partition, rp.ErrorCode = p.Partition, code
				rt.Partitions = append(rt.Partitions, rp)
			}
			resp.Topics = append(resp.Topics, rt)
		}
		return resp
	}
}

func (f *Floor) accept() {
	defer f.wg.Done()
	for {
		conn, err := f.ln.Accept()
		if err != nil {
			return
		}
		f.mu.Lock()
		if f.conns == nil { // closed
			f.mu.Unlock()
			_ = conn.Close()
			return
		}
		f.conns[conn] = struct{}{}
		f.wg.Add(1)
		f.mu.Unlock()
		go f.serve(conn)
	}
}

func (f *Floor) close() {
	_ = f.ln.Close()
	f.mu.Lock()
	for conn := range f.conns {
		_ = conn.Close()
	}
	f.conns = nil
	f.mu.Unlock()
	f.wg.Wait()
}

// track adds conn to the connections closed with the floor, or closes it at once if the floor is
// closed already.
func (f *Floor) track(conn net.Conn) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.conns == nil {
		_ = conn.Close()
		return
	}
	f.conns[conn] = struct{}{}
}

func (f *Floor) forget(conn net.Conn) {
	_ = conn.Close()
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.conns, conn)
}

// serve passes one client connection's requests on to a connection of its own to the broker, one
// request at a time, as a broker serves a connection.
func (f *Floor) serve(client net.Conn) {
	defer f.wg.Done()
	defer f.forget(client)
	broker, err := net.DialTimeout("tcp", f.upstream, 10*time.Second)
	if err != nil {
		return
	}
	f.track(broker)
	defer f.forget(broker)
	for {
		req, err := readRequest(client)
		if err != nil {
			return
		}
		if !f.handle(client, broker, req) {
			return
		}
	}
}

// request is one request read off a client connection.
type request struct {
	Request
	corr  int32
	frame []byte // the whole request as read, its size first
	body  []byte // the request after its header
}

// handle serves one request and reports whether the connection stays open.
func (f *Floor) handle(client, broker net.Conn, req *request) bool {
	if r, ok := kafka41[req.Key]; !ok || req.Version < r.Min || req.Version > r.Max {
		return f.refuseVersion(client, req, ok && req.Version > r.Max)
	}
	f.record(f.served, req.Request)
	f.mu.Lock()
	answer, refused := f.refusals[req.Key]
	f.mu.Unlock()
	if refused {
		if answer == nil {
			return false
		}
		parsed, err := req.parse()
		if err != nil {
			return false
		}
		return write(client, appendResponse(nil, req.corr, answer(parsed)))
	}
	if !write(broker, req.frame) {
		return false
	}
	if req.Key == produceKey && req.acksNone() {
		return true // no response to an acks=0 produce
	}
	resp, err := readFrame(broker)
	if err != nil {
		return false
	}
	if resp, err = f.rewrite(req, resp); err != nil {
		return false
	}
	return write(client, resp)
}

// refuseVersion answers req, a request at a version Kafka 4.1 does not serve (newer than it serves:
// newer), and reports whether the connection stays open.
func (f *Floor) refuseVersion(client net.Conn, req *request, newer bool) bool {
	if req.Key == apiVersionsKey && newer {
		// A client newer than the broker asks ApiVersions at its own version first and is told
		// which to use (KIP-511), as franz-go and the Java client do: served, not outside.
		f.record(f.served, req.Request)
		return write(client, unsupportedAPIVersions(req.corr))
	}
	f.record(f.outside, req.Request)
	if req.Key == apiVersionsKey {
		return write(client, unsupportedAPIVersions(req.corr))
	}
	return false
}

func (f *Floor) record(set map[Request]struct{}, r Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	set[r] = struct{}{}
}

const (
	apiVersionsKey     = 18
	metadataKey        = 3
	findCoordinatorKey = 10
	describeClusterKey = 60
	maxFrame           = 256 << 20
)

// readFrame reads one size-prefixed frame and returns it whole.
func readFrame(r io.Reader) ([]byte, error) {
	var size [4]byte
	if _, err := io.ReadFull(r, size[:]); err != nil {
		return nil, err
	}
	n := binary.BigEndian.Uint32(size[:])
	if n > maxFrame {
		return nil, fmt.Errorf("frame of %d bytes", n)
	}
	frame := make([]byte, 4+n)
	copy(frame, size[:])
	_, err := io.ReadFull(r, frame[4:])
	return frame, err
}

// readRequest reads a request and its header: API key, version, correlation ID and client ID.
func readRequest(r io.Reader) (*request, error) {
	frame, err := readFrame(r)
	if err != nil {
		return nil, err
	}
	b := kbin.Reader{Src: frame[4:]}
	req := &request{frame: frame}
	req.Key, req.Version, req.corr = b.Int16(), b.Int16(), b.Int32()
	if id := b.NullableString(); id != nil {
		req.ClientID = *id
	}
	if k := kmsg.RequestForKey(req.Key); k != nil {
		k.SetVersion(req.Version)
		if k.IsFlexible() {
			kmsg.SkipTags(&b)
		}
	}
	if !b.Ok() {
		return nil, errors.New("short request header")
	}
	req.body = b.Src
	return req, nil
}

// parse decodes the request's body.
func (req *request) parse() (kmsg.Request, error) {
	k := kmsg.RequestForKey(req.Key)
	if k == nil {
		return nil, fmt.Errorf("unknown API key %d", req.Key)
	}
	k.SetVersion(req.Version)
	return k, k.ReadFrom(req.body)
}

// acksNone reports whether a produce request asks for no acknowledgement, so gets no response.
func (req *request) acksNone() bool {
	parsed, err := req.parse()
	return err == nil && parsed.(*kmsg.ProduceRequest).Acks == 0
}

func write(w io.Writer, b []byte) bool {
	_, err := w.Write(b)
	return err == nil
}

// appendResponse appends a response frame: size, correlation ID, the header's tags when the
// response is flexible (never for ApiVersions), the response.
func appendResponse(dst []byte, corr int32, resp kmsg.Response) []byte {
	start := len(dst)
	dst = binary.BigEndian.AppendUint32(dst, 0)
	dst = binary.BigEndian.AppendUint32(dst, uint32(corr))
	if resp.IsFlexible() && resp.Key() != apiVersionsKey {
		dst = append(dst, 0)
	}
	dst = resp.AppendTo(dst)
	binary.BigEndian.PutUint32(dst[start:], uint32(len(dst)-start-4))
	return dst
}

// unsupportedAPIVersions is 4.1's answer to an ApiVersions request of a version it does not serve:
// a version 0 response, UNSUPPORTED_VERSION, listing ApiVersions' own range, for the client to
// retry with a version in it (KIP-511).
func unsupportedAPIVersions(corr int32) []byte {
	resp := kmsg.NewPtrApiVersionsResponse()
	resp.ErrorCode = 35 // UNSUPPORTED_VERSION
	k := kmsg.NewApiVersionsResponseApiKey()
	r := kafka41[apiVersionsKey]
	k.ApiKey, k.MinVersion, k.MaxVersion = apiVersionsKey, r.Min, r.Max
	resp.ApiKeys = []kmsg.ApiVersionsResponseApiKey{k}
	return appendResponse(nil, corr, resp)
}

// rewrite makes the broker's response to req what a 4.1 broker behind this address would answer:
// ApiVersions with 4.1's ranges, broker addresses the proxy's. Other responses pass unchanged.
func (f *Floor) rewrite(req *request, frame []byte) ([]byte, error) {
	switch req.Key {
	case apiVersionsKey, metadataKey, findCoordinatorKey, describeClusterKey:
	default:
		return frame, nil
	}
	k := kmsg.RequestForKey(req.Key)
	k.SetVersion(req.Version)
	resp := k.ResponseKind()
	b := kbin.Reader{Src: frame[4:]}
	corr := b.Int32()
	if resp.IsFlexible() && req.Key != apiVersionsKey {
		kmsg.SkipTags(&b)
	}
	if !b.Ok() {
		return nil, errors.New("short response header")
	}
	if err := resp.ReadFrom(b.Src); err != nil {
		return nil, fmt.Errorf("%s response: %w", kmsg.NameForKey(req.Key), err)
	}
	switch resp := resp.(type) {
	case *kmsg.ApiVersionsResponse:
		advertise41(resp)
	case *kmsg.MetadataResponse:
		for i := range resp.Brokers {
			resp.Brokers[i].Host, resp.Brokers[i].Port = f.host, f.port
		}
	case *kmsg.FindCoordinatorResponse:
		if resp.Host != "" {
			resp.Host, resp.Port = f.host, f.port
		}
		for i := range resp.Coordinators {
			resp.Coordinators[i].Host, resp.Coordinators[i].Port = f.host, f.port
		}
	case *kmsg.DescribeClusterResponse:
		for i := range resp.Brokers {
			resp.Brokers[i].Host, resp.Brokers[i].Port = f.host, f.port
		}
	}
	return appendResponse(nil, corr, resp), nil
}

// advertise41 narrows a successful ApiVersions answer to 4.1's APIs and ranges.
func advertise41(resp *kmsg.ApiVersionsResponse) {
	if resp.ErrorCode != 0 {
		return
	}
	keys := resp.ApiKeys[:0]
	for _, k := range resp.ApiKeys {
		r, ok := advertised41(k.ApiKey)
		if !ok {
			continue
		}
		if k.ApiKey == produceKey {
			k.MinVersion = r.Min
		}
		k.MinVersion, k.MaxVersion = max(k.MinVersion, r.Min), min(k.MaxVersion, r.Max)
		if k.MinVersion <= k.MaxVersion {
			keys = append(keys, k)
		}
	}
	resp.ApiKeys = keys
}
