package notify

import "strings"

// ValidPhone reports whether phone is in E.164: '+' then 8 to 15 digits, the first of them 1–9.
func ValidPhone(phone string) bool {
	if len(phone) < 9 || len(phone) > 16 || phone[0] != '+' || phone[1] == '0' {
		return false
	}
	for _, c := range []byte(phone[1:]) {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// MaskPhone returns phone with its middle digits hidden, for logs and error text:
// +8613800138000 becomes +86138****8000. At most 9 digits are shown and at least 4 are hidden, so a
// short number is never shown whole (+12345678 becomes +12****78); the hidden run is always written
// as four stars, whatever its length. Anything that is not an E.164 number is hidden entirely.
func MaskPhone(phone string) string {
	if !ValidPhone(phone) {
		return "****"
	}
	digits := phone[1:]
	hidden := max(4, len(digits)-9)
	shown := len(digits) - hidden
	tail := min(4, shown/2)
	head := shown - tail
	var b strings.Builder
	b.Grow(1 + head + 4 + tail)
	b.WriteByte('+')
	b.WriteString(digits[:head])
	b.WriteString("****")
	b.WriteString(digits[len(digits)-tail:])
	return b.String()
}
