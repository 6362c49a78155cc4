package fault

import (
	"errors"
)

// The problems of a message that does not verify. A verifier's error wraps one of them; the
// consumer counts each failure under its problem (see SignatureProblem).
var (
	ErrUnsigned           = errors.New("not signed")
	ErrSignatureMalformed = errors.New("signature malformed")
	ErrSignatureTimestamp = errors.New("signature timestamp outside the tolerance")
	ErrNoKeyMatched       = errors.New("no key matched the signature")
)

// signatureProblems name each problem, as the metric's reason label; the last is the default.
var signatureProblems = []struct {
	err  error
	name string
}{
	{ErrUnsigned, "unsigned"},
	{ErrSignatureMalformed, "malformed"},
	{ErrSignatureTimestamp, "timestamp"},
	{ErrNoKeyMatched, "no_key_matched"},
}

// SignatureProblems are the names SignatureProblem returns.
func SignatureProblems() []string {
	names := make([]string, len(signatureProblems))
	for i, p := range signatureProblems {
		names[i] = p.name
	}
	return names
}

// SignatureProblem names the problem err, a verifier's error, wraps; an error that wraps none is a
// signature that does not match (no_key_matched), which a verifier's own error is taken for.
func SignatureProblem(err error) string {
	for _, p := range signatureProblems {
		if errors.Is(err, p.err) {
			return p.name
		}
	}
	return signatureProblems[len(signatureProblems)-1].name
}
