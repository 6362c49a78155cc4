package fault

import "errors"

// BadSignature is the reason of a message its route's verifier refused: not signed, signed by no
// key it knows, malformed, or signed too far from when it was produced. Never retried, nothing of
// it recorded.
const BadSignature Reason = "bad_signature"

// The problems of a message that does not verify. A verifier's error wraps one of them; the
// consumer counts each failure under its problem (see SignatureProblem).
var (
	ErrUnsigned           = errors.New("not signed")
	ErrSignatureMalformed = errors.New("signature malformed")
	ErrNoKeyMatched       = errors.New("no key matched the signature")
	ErrSignatureTimestamp = errors.New("signature timestamp outside the tolerance")
)

// SignatureProblems are the values SignatureProblem returns, in the order of its checks.
var SignatureProblems = []string{"unsigned", "malformed", "timestamp", "no_key_matched"}

// SignatureProblem names the problem err, a verifier's error, wraps: unsigned, malformed or timestamp;
// else no_key_matched, the failure of a signature that does not match, which an error of a
// verifier's own is taken for.
func SignatureProblem(err error) string {
	switch {
	case errors.Is(err, ErrUnsigned):
		return "unsigned"
	case errors.Is(err, ErrSignatureMalformed):
		return "malformed"
	case errors.Is(err, ErrSignatureTimestamp):
		return "timestamp"
	}
	return "no_key_matched"
}
