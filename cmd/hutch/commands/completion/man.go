package completion

import (
	"fmt"
	"io"
	"strings"
)

// Man writes the manual page of the tree in roff (man(7)): the synopsis,
// the global options, then each command with its usage, description and
// options, and the environment variables the flags read. section and
// date head the page.
func Man(w io.Writer, t *Node, section, date, version string) {
	up := strings.ToUpper(t.Name)
	fmt.Fprintf(w, ".\\\" Made by `%s man` from the CLI's own definitions.\n", t.Name)
	fmt.Fprintf(w, ".TH %s %s %s %s %s\n", up, section, roffArg(date), roffArg(t.Name+" "+version), roffArg(t.Name+" manual"))
	fmt.Fprintf(w, ".SH NAME\n%s \\- %s\n", t.Name, roffText(t.Usage))
	fmt.Fprintf(w, ".SH SYNOPSIS\n.B %s\n[\\fIGLOBAL OPTIONS\\fR] \\fICOMMAND\\fR [\\fIOPTIONS\\fR] [\\fIARGUMENTS\\fR]\n", t.Name)
	if t.Description != "" {
		fmt.Fprintf(w, ".SH DESCRIPTION\n%s\n", roffParagraphs(t.Description))
	}
	fmt.Fprintf(w, ".SH GLOBAL OPTIONS\n")
	manFlags(w, t.Flags)
	fmt.Fprintf(w, ".SH COMMANDS\n")
	for _, s := range t.Subs {
		s.Walk(func(n *Node) {
			fmt.Fprintf(w, ".SS %s\n", roffText(t.Name+" "+n.Key()))
			syn := t.Name + " " + n.Key()
			if len(n.Flags) > 1 {
				syn += " [OPTIONS]"
			}
			if n.ArgsUsage != "" {
				syn += " " + n.ArgsUsage
			}
			fmt.Fprintf(w, ".B %s\n.br\n", roffText(syn))
			if len(n.Aliases) > 0 {
				fmt.Fprintf(w, "Also: %s.\n.br\n", roffText(strings.Join(n.Aliases, ", ")))
			}
			fmt.Fprintf(w, "%s\n", roffText(capitalize(n.Usage)+"."))
			if n.Description != "" {
				fmt.Fprintf(w, ".PP\n%s\n", roffParagraphs(n.Description))
			}
			if len(n.Flags) > 0 {
				fmt.Fprintf(w, ".PP\nOptions:\n")
				manFlags(w, n.Flags)
			}
		})
	}
	var env []string
	t.Walk(func(n *Node) {
		for _, f := range n.Flags {
			for _, e := range f.EnvVars {
				where := t.Name
				if n.Key() != "" {
					where += " " + n.Key()
				}
				env = append(env, fmt.Sprintf(".TP\n.B %s\n%s\n", e, roffText(where+" "+f.Spellings()[0])))
			}
		}
	})
	if len(env) > 0 {
		fmt.Fprintf(w, ".SH ENVIRONMENT\nEach variable sets the option it names when the option is not given.\n%s", strings.Join(env, ""))
	}
	fmt.Fprintf(w, ".SH EXIT STATUS\n0 on success; 125 for a usage error or a failure of %s itself;\n.B exec\nand\n.B run\nexit with the command's own status (126: not executable, 127: not found).\n", t.Name)
	fmt.Fprintf(w, ".SH FILES\n.TP\n.I /etc/hutch/serve.toml\nthe settings of\n.BR \"hutch serve\" ;\none key per option of serve.\n.TP\n.I /var/lib/hutch\nthe state root of root's sandboxes, images and server.\n")
}

func manFlags(w io.Writer, flags []Flag) {
	for _, f := range flags {
		var names []string
		for _, sp := range f.Spellings() {
			n := "\\fB" + roffText(sp) + "\\fR"
			if f.TakesValue {
				n += " \\fIvalue\\fR"
			}
			names = append(names, n)
		}
		usage := f.Usage
		if f.Default != "" && f.TakesValue {
			usage += " (default: " + f.Default + ")"
		}
		fmt.Fprintf(w, ".TP\n%s\n%s\n", strings.Join(names, ", "), roffText(usage))
	}
}

// roffText escapes s for a line of roff text: backslashes, dashes, and
// a leading dot or quote that roff would read as a request.
func roffText(s string) string {
	s = strings.ReplaceAll(s, `\`, `\e`)
	s = strings.ReplaceAll(s, "-", `\-`)
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.HasPrefix(l, ".") || strings.HasPrefix(l, "'") {
			l = `\&` + l
		}
		out = append(out, l)
	}
	return strings.Join(out, "\n")
}

// roffArg is s as one quoted argument of a request.
func roffArg(s string) string { return `"` + strings.ReplaceAll(roffText(s), `"`, `\(dq`) + `"` }

// roffParagraphs is text whose blank lines separate paragraphs; each
// paragraph's lines are joined, and indented lines are kept as they are.
func roffParagraphs(text string) string {
	var out []string
	for i, p := range strings.Split(strings.TrimSpace(text), "\n\n") {
		if i > 0 {
			out = append(out, ".PP")
		}
		lines := strings.Split(p, "\n")
		if strings.HasPrefix(lines[0], "  ") || strings.HasPrefix(lines[0], "\t") {
			out = append(out, ".nf", roffText(p), ".fi")
			continue
		}
		out = append(out, roffText(strings.Join(strings.Fields(p), " ")))
	}
	return strings.Join(out, "\n")
}

func capitalize(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}
