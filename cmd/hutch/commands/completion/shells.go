package completion

import (
	"fmt"
	"io"
	"strings"
)

// Bash writes the bash completion of the tree: a table of each command's
// subcommands and flags, and a function that follows the words typed so
// far through it (skipping flags and the values of flags that take one).
func Bash(w io.Writer, t *Node) {
	name := t.Name
	fn := "_" + strings.ReplaceAll(name, "-", "_")
	fmt.Fprintf(w, "# bash completion for %s; made by `%s completion bash` from its own definitions.\n\n", name, name)
	fmt.Fprintf(w, "%s_next() {\n\tcase \"$1|$2\" in\n", fn)
	t.Walk(func(n *Node) {
		for _, s := range n.Subs {
			pats := []string{shq(n.Key() + "|" + s.Name)}
			for _, a := range s.Aliases {
				pats = append(pats, shq(n.Key()+"|"+a))
			}
			fmt.Fprintf(w, "\t%s) echo %s ;;\n", strings.Join(pats, "|"), shq(s.Key()))
		}
	})
	fmt.Fprintf(w, "\tesac\n}\n\n")
	table := func(fname string, words func(*Node) []string) {
		fmt.Fprintf(w, "%s_%s() {\n\tcase \"$1\" in\n", fn, fname)
		t.Walk(func(n *Node) {
			if ws := words(n); len(ws) > 0 {
				fmt.Fprintf(w, "\t%s) echo %s ;;\n", shq(n.Key()), shq(strings.Join(ws, " ")))
			}
		})
		fmt.Fprintf(w, "\tesac\n}\n\n")
	}
	table("subs", (*Node).SubNames)
	table("flags", func(n *Node) []string { return n.FlagSpellings(false) })
	table("valued", func(n *Node) []string { return n.FlagSpellings(true) })
	fmt.Fprintf(w, `%[1]s() {
	local cur="${COMP_WORDS[COMP_CWORD]}" cmdpath="" next w i skip=0
	for ((i = 1; i < COMP_CWORD; i++)); do
		w="${COMP_WORDS[i]}"
		if ((skip)); then skip=0; continue; fi
		case "$w" in
		--) return 0 ;;
		--*=*) continue ;;
		-*)
			case " $(%[1]s_valued "$cmdpath") $(%[1]s_valued "") " in *" $w "*) skip=1 ;; esac
			continue ;;
		esac
		next="$(%[1]s_next "$cmdpath" "$w")"
		[ -n "$next" ] && cmdpath="$next"
	done
	if [[ "$cur" == -* ]]; then
		COMPREPLY=($(compgen -W "$(%[1]s_flags "$cmdpath")" -- "$cur"))
	else
		COMPREPLY=($(compgen -W "$(%[1]s_subs "$cmdpath")" -- "$cur"))
		if [ ${#COMPREPLY[@]} -eq 0 ]; then COMPREPLY=($(compgen -f -- "$cur")); fi
	fi
	return 0
}

complete -F %[1]s %[2]s
`, fn, name)
}

// Zsh writes the zsh completion of the tree: the same walk as Bash's,
// offering subcommands and flags with their descriptions.
func Zsh(w io.Writer, t *Node) {
	name := t.Name
	fn := "_" + strings.ReplaceAll(name, "-", "_")
	fmt.Fprintf(w, "#compdef %s\n# zsh completion for %s; made by `%s completion zsh` from its own definitions.\n\n", name, name, name)
	fmt.Fprintf(w, "%s_next() {\n\tcase \"$1|$2\" in\n", fn)
	t.Walk(func(n *Node) {
		for _, s := range n.Subs {
			pats := []string{shq(n.Key() + "|" + s.Name)}
			for _, a := range s.Aliases {
				pats = append(pats, shq(n.Key()+"|"+a))
			}
			fmt.Fprintf(w, "\t%s) print -r -- %s ;;\n", strings.Join(pats, "|"), shq(s.Key()))
		}
	})
	fmt.Fprintf(w, "\tesac\n}\n\n")
	// Each entry is WORD:DESCRIPTION, as _describe takes them.
	fmt.Fprintf(w, "%s_subs() {\n\tcase \"$1\" in\n", fn)
	t.Walk(func(n *Node) {
		if len(n.Subs) == 0 {
			return
		}
		var items []string
		for _, s := range n.Subs {
			for _, nm := range append([]string{s.Name}, s.Aliases...) {
				items = append(items, shq(nm+":"+zdesc(s.Usage)))
			}
		}
		fmt.Fprintf(w, "\t%s) reply=(%s) ;;\n", shq(n.Key()), strings.Join(items, " "))
	})
	fmt.Fprintf(w, "\t*) reply=() ;;\n\tesac\n}\n\n")
	fmt.Fprintf(w, "%s_flags() {\n\tcase \"$1\" in\n", fn)
	t.Walk(func(n *Node) {
		var items []string
		for _, f := range n.Flags {
			for _, sp := range f.Spellings() {
				items = append(items, shq(sp+":"+zdesc(f.Usage)))
			}
		}
		fmt.Fprintf(w, "\t%s) reply=(%s) ;;\n", shq(n.Key()), strings.Join(items, " "))
	})
	fmt.Fprintf(w, "\t*) reply=() ;;\n\tesac\n}\n\n")
	fmt.Fprintf(w, "%s_valued() {\n\tcase \"$1\" in\n", fn)
	t.Walk(func(n *Node) {
		if v := n.FlagSpellings(true); len(v) > 0 {
			fmt.Fprintf(w, "\t%s) print -r -- %s ;;\n", shq(n.Key()), shq(" "+strings.Join(v, " ")+" "))
		}
	})
	fmt.Fprintf(w, "\tesac\n}\n\n")
	fmt.Fprintf(w, `%[1]s() {
	local cmdpath="" next w i skip=0 cur="${words[CURRENT]}"
	local -a reply
	for ((i = 2; i < CURRENT; i++)); do
		w="${words[i]}"
		if ((skip)); then skip=0; continue; fi
		case "$w" in
		--) _files; return ;;
		--*=*) continue ;;
		-*)
			case "$(%[1]s_valued "$cmdpath")$(%[1]s_valued "")" in *" $w "*) skip=1 ;; esac
			continue ;;
		esac
		next="$(%[1]s_next "$cmdpath" "$w")"
		[[ -n "$next" ]] && cmdpath="$next"
	done
	if [[ "$cur" == -* ]]; then
		%[1]s_flags "$cmdpath"
		_describe -t flags 'flag' reply
	else
		%[1]s_subs "$cmdpath"
		if (( ${#reply} )); then
			_describe -t commands 'command' reply
		else
			_files
		fi
	fi
}

if [[ "$funcstack[1]" == "%[1]s" ]]; then
	%[1]s "$@"
else
	compdef %[1]s %[2]s
fi
`, fn, name)
}

// Fish writes the fish completion of the tree: one `complete` line per
// subcommand and flag, each under the condition that the words typed so
// far lead to its command.
func Fish(w io.Writer, t *Node) {
	name := t.Name
	fn := "__" + strings.ReplaceAll(name, "-", "_")
	fmt.Fprintf(w, "# fish completion for %s; made by `%s completion fish` from its own definitions.\n\n", name, name)
	fmt.Fprintf(w, "function %s_next --argument-names path word\n\tswitch \"$path|$word\"\n", fn)
	t.Walk(func(n *Node) {
		for _, s := range n.Subs {
			pats := []string{fishq(n.Key() + "|" + s.Name)}
			for _, a := range s.Aliases {
				pats = append(pats, fishq(n.Key()+"|"+a))
			}
			fmt.Fprintf(w, "\t\tcase %s\n\t\t\techo %s\n", strings.Join(pats, " "), fishq(s.Key()))
		}
	})
	fmt.Fprintf(w, "\tend\nend\n\n")
	fmt.Fprintf(w, "function %s_valued --argument-names path\n\tswitch \"$path\"\n", fn)
	t.Walk(func(n *Node) {
		if v := n.FlagSpellings(true); len(v) > 0 {
			fmt.Fprintf(w, "\t\tcase %s\n\t\t\techo %s\n", fishq(n.Key()), fishq(strings.Join(v, " ")))
		}
	})
	fmt.Fprintf(w, "\tend\nend\n\n")
	fmt.Fprintf(w, `# %[1]s_path is the command the words typed so far lead to.
function %[1]s_path
	set -l words (commandline -opc)
	set -l path ""
	set -l skip 0
	for w in $words[2..-1]
		if test $skip -eq 1
			set skip 0
			continue
		end
		switch $w
			case '--'
				echo -- "--"
				return
			case '--*=*'
				continue
			case '-*'
				if contains -- $w (string split ' ' -- (%[1]s_valued "$path") (%[1]s_valued ""))
					set skip 1
				end
				continue
		end
		set -l next (%[1]s_next "$path" $w)
		if test -n "$next"
			set path $next
		end
	end
	echo -- $path
end

function %[1]s_at --argument-names want
	set -l p (%[1]s_path)
	test "$p" = "$want"
end

complete -c %[2]s -f
`, fn, name)
	t.Walk(func(n *Node) {
		cond := fishq(fn + "_at " + fishq(n.Key()))
		for _, s := range n.Subs {
			for _, nm := range append([]string{s.Name}, s.Aliases...) {
				fmt.Fprintf(w, "complete -c %s -n %s -a %s -d %s\n", name, cond, fishq(nm), fishq(oneLine(s.Usage)))
			}
		}
		for _, f := range n.Flags {
			var opts []string
			for _, nm := range f.Names {
				if len(nm) == 1 {
					opts = append(opts, "-s "+fishq(nm))
				} else {
					opts = append(opts, "-l "+fishq(nm))
				}
			}
			if f.TakesValue {
				opts = append(opts, "-r")
			}
			fmt.Fprintf(w, "complete -c %s -n %s %s -d %s\n", name, cond, strings.Join(opts, " "), fishq(oneLine(f.Usage)))
		}
	})
}

// shq quotes s for sh: in single quotes.
func shq(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// fishq quotes s for fish: in single quotes, with \ and ' escaped.
func fishq(s string) string {
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(s) + "'"
}

// zdesc is a description for _describe: one line, colons escaped.
func zdesc(s string) string { return strings.ReplaceAll(oneLine(s), ":", `\:`) }

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }
