// Builds the console's pages into ../dist: one script and one style
// sheet bundled by esbuild from src/ and node_modules (npm ci), and
// index.html. Nothing is fetched at run time.
import * as esbuild from 'esbuild';
import { copyFileSync, mkdirSync, readdirSync, rmSync } from 'node:fs';

const out = new URL('../dist/', import.meta.url).pathname;
for (const f of readdirSync(out)) if (f !== 'README.md') rmSync(out + f, { recursive: true });
mkdirSync(out, { recursive: true });
await esbuild.build({
  entryPoints: ['src/app.js', 'src/app.css'],
  bundle: true, minify: true, format: 'esm', outdir: out, target: 'es2022', legalComments: 'linked',
  loader: { '.woff2': 'file', '.ttf': 'file' },
});
copyFileSync('src/index.html', out + 'index.html');
