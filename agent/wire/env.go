package wire

import "strings"

// MergeEnv concatenates environments; a later KEY replaces an earlier one.
func MergeEnv(lists ...[]string) []string {
	var out []string
	idx := map[string]int{}
	for _, l := range lists {
		for _, kv := range l {
			k, _, _ := strings.Cut(kv, "=")
			if i, ok := idx[k]; ok {
				out[i] = kv
				continue
			}
			idx[k] = len(out)
			out = append(out, kv)
		}
	}
	return out
}
