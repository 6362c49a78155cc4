package notify

import (
	"strings"
	"unicode"
	"unicode/utf8"
)

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

// minMaskedDigits is the fewest digits MaskNumbers hides: fewer are a code, a count or a status, never
// a whole phone number (E.164 numbers have at least 8 digits, national forms at least 7).
const minMaskedDigits = 7

// MaskNumbers returns text with every run of at least 7 digits replaced by "[number]", for error
// text quoting a provider. A run is digits of any script (full-width, Arabic-Indic, … — any Unicode
// number) joined by anything that is not a letter: spaces of any kind and count, dashes, dots,
// parentheses, slashes, invisible characters. A '+' just before a run stays. Letters end a run, so
// a template name or an id with a few digits survives, and so would a number spelled with letters
// between its digits.
func MaskNumbers(text string) string {
	var b strings.Builder
	written := 0         // text[:written] is in b
	start, end := -1, -1 // the current run: text[start:end], from its first digit to its last
	digits := 0
	flush := func() {
		if digits >= minMaskedDigits {
			b.WriteString(text[written:start])
			b.WriteString("[number]")
			written = end
		}
		start, digits = -1, 0
	}
	for i, r := range text {
		switch {
		case unicode.IsNumber(r):
			if start < 0 {
				start = i
			}
			end = i + utf8.RuneLen(r)
			digits++
		case unicode.IsLetter(r):
			flush()
		}
	}
	flush()
	if written == 0 {
		return text
	}
	b.WriteString(text[written:])
	return b.String()
}

// recipientMark stands for the recipient's number in a text while MaskNumbers runs, so that the
// recipient appears as MaskPhone shows it and every other number as [number].
const recipientMark = "\x00recipient\x00"

// maskNumbersFor is MaskNumbers for a text about an SMS to the number to (a provider's answer, or
// its message id): the recipient, when the text holds it, shown as MaskPhone shows it, so that a
// reader sees which number it was about.
func maskNumbersFor(text, to string) string {
	if to != "" {
		text = strings.ReplaceAll(text, to, recipientMark)
	}
	text = MaskNumbers(text)
	if to != "" {
		text = strings.ReplaceAll(text, recipientMark, MaskPhone(to))
	}
	return text
}

// maxPhoneDigits is the most digits of a phone number (E.164).
const maxPhoneDigits = 15

// maskMessageID is a provider's message id as a log shows it: each word of it (a run of letters and
// digits) that is all digits, 7 to 15 of them, is a phone number, masked — the recipient's shown as
// MaskPhone shows it (its '+' the id's), any other as [number]. A word mixing letters and digits (a hash:
// log-17333563ad1ca5ad) or of more digits than a phone number has (a counter: 900619746936498440^0)
// stays whole: an id is quoted to the provider's support.
func maskMessageID(id, to string) string {
	var b strings.Builder
	written, start := 0, -1
	allDigits := true
	for i, r := range id + " " { // the space ends the last word
		if unicode.IsLetter(r) || unicode.IsNumber(r) {
			if start < 0 {
				start, allDigits = i, true
			}
			allDigits = allDigits && r >= '0' && r <= '9'
			continue
		}
		if start < 0 {
			continue
		}
		word := id[start:i]
		if allDigits && len(word) >= minMaskedDigits && len(word) <= maxPhoneDigits {
			from := start
			if from > 0 && id[from-1] == '+' {
				from-- // the number's own '+'
			}
			b.WriteString(id[written:from])
			if national := strings.TrimPrefix(word, "0"); strings.HasSuffix(strings.TrimPrefix(to, "+"), national) {
				b.WriteString(id[from:start] + strings.TrimPrefix(MaskPhone(to), "+"))
			} else {
				b.WriteString(id[from:start] + "[number]")
			}
			written = i
		}
		start = -1
	}
	if written == 0 {
		return id
	}
	b.WriteString(id[written:])
	return b.String()
}
