// Lint for the JupyterLab extension: typescript-eslint's recommended rules (tsc --noEmit, run
// by `npm run typecheck`, does the type checking).
// Run `npm run lint` (eslint + prettier --check) or `npm run lint:fix`; scripts/lint.sh runs it.
import js from '@eslint/js';
import globals from 'globals';
import tseslint from 'typescript-eslint';

export default tseslint.config(
  { ignores: ['lib/', 'node_modules/', '**/*.gen.ts', 'eslint.config.mjs'] },
  js.configs.recommended,
  ...tseslint.configs.recommended,
  {
    languageOptions: {
      globals: globals.browser
    },
    rules: {
      '@typescript-eslint/no-unused-vars': ['error', { argsIgnorePattern: '^_' }],
      eqeqeq: ['error', 'smart'],
      curly: ['error', 'all']
    }
  }
);
