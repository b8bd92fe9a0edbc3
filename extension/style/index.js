import './palette.gen.css';
import './base.css';
